"""Where hang evidence lives on disk, for both sides: the workers that write it and the
controller that reads it. Pure module (stdlib and the run-dir reader only).

    <run_dir>/diagnostics/
      live/rank<N>/pending.json       the op rank N announced before a risky collective
      <stamp>/rank<N>/summary.json    one diagnosis round's evidence of rank N (+ raw files)
      <stamp>/node-<name>/            per-node evidence of that round (nvidia-smi -q)

One stamp per round (`stamp_now()` plus a round counter) so every rank of a round writes into
one folder. Files are written atomically: a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.isolation import runfiles

PathLike = str | os.PathLike[str]


def stamp_now() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S")


def diagnostics_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / "diagnostics"


def rank_dir(run_dir: PathLike, *, stamp: str, rank: int) -> Path:
    return diagnostics_dir(run_dir) / stamp / f"rank{rank}"


def node_dir(run_dir: PathLike, *, stamp: str, node: str) -> Path:
    return diagnostics_dir(run_dir) / stamp / f"node-{node}"


def announcement_path(run_dir: PathLike, rank: int) -> Path:
    return diagnostics_dir(run_dir) / "live" / f"rank{rank}" / "pending.json"


def write_json(path: Path, data: Any) -> None:
    """Writes `data` as JSON through a temporary file and a rename (atomic on POSIX)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(path)


def write_announcement(run_dir: PathLike, rank: int, announcement: dict[str, Any]) -> None:
    write_json(announcement_path(run_dir, rank), announcement)


def read_announcement(run_dir: PathLike, rank: int) -> dict[str, Any] | None:
    """The last announcement of a rank (read on its node for ranks that died or stay silent),
    beneath the run dir without following a link: the run dir is the job's to write."""
    data = runfiles.read_json(run_dir, announcement_path(run_dir, rank))
    return data if isinstance(data, dict) else None


def clear_announcement(run_dir: PathLike, rank: int) -> None:
    """Called after the announced op returned, so a stale announcement never misleads."""
    with contextlib.suppress(OSError):
        announcement_path(run_dir, rank).unlink()
