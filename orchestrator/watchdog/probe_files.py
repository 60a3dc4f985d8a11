"""The watcher's side of the probe inside a user's rank process (meshyard/_probe.py): read its
progress, ask it for evidence, and turn the answer into the per-rank summary the analyzer reads
(`inputs.RankEvidence.from_summary`, the same dict `workers.evidence.collect_evidence` returns
for the built-in loop). Pure module: files and pickle, no torch. The worker actor of a rank
(workers/usercode.py) and `meshyard watch` (api/cli/watch_cmds.py) both use it.

    ask(probe_dir, rank, out=diag_dir / f"rank{rank}", request_id=stamp)
    info = await_answer(out, request_id=stamp, timeout_s=10)   # None: the rank did not answer
    summary = rank_summary(info, rank=rank, out=out, step=None, log_paths=(stderr_log,))
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.watchdog.flight_recorder import trim_dump
from orchestrator.watchdog.logs import parse_lines

_LOG_KINDS = {"nccl_warn", "torch_watchdog_timeout", "gloo_timeout", "collective_mismatch"}
_TAIL_BYTES = 64 * 1024


def progress_path(probe_dir: str | Path, rank: int) -> Path:
    return Path(probe_dir) / f"rank{rank}.progress.json"


def request_path(probe_dir: str | Path, rank: int) -> Path:
    return Path(probe_dir) / f"rank{rank}.request"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_progress(probe_dir: str | Path, rank: int) -> dict[str, Any] | None:
    """{"pid", "time", "collectives": {pg: {"enqueued", "completed"}}} or None."""
    return _read_json(progress_path(probe_dir, rank))


def collective_count(collectives: Mapping[str, Any] | None) -> int | None:
    """One number that grows whenever any of a rank's groups enqueues a collective: the sum
    of the last enqueued seqs (None before the first collective)."""
    total, seen = 0, False
    for st in (collectives or {}).values():
        n = st.get("enqueued") if isinstance(st, Mapping) else None
        if isinstance(n, int) and n > 0:
            total, seen = total + n, True
    return total if seen else None


def ask(probe_dir: str | Path, rank: int, *, out: Path, request_id: str) -> None:
    """Ask rank `rank`'s probe for its evidence, to be written under `out`."""
    path = request_path(probe_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"id": request_id, "out": str(out)}))
    os.replace(tmp, path)


def await_answer(out: Path, *, request_id: str, timeout_s: float, poll_s: float = 0.05,
                 alive: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """The probe's answer to `request_id`; None after `timeout_s`, or as soon as `alive()`
    says the rank process is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = _read_json(out / "probe.json")
        if info is not None and str(info.get("id")) == request_id:
            return info
        if time.monotonic() > deadline or (alive is not None and not alive()):
            return None
        time.sleep(poll_s)


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - _TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


def log_errors(paths: Sequence[str | Path], *, out: Path | None = None) -> list[str]:
    """NCCL / gloo / torch errors in the tails of `paths` (the tails kept under `out`)."""
    texts = [_tail(Path(p)) for p in paths if Path(p).is_file()]
    if not texts:
        return []
    joined = "\n".join(texts)
    if out is not None:
        (out / "nccl_debug_tail.log").write_text(joined)
    return [e.describe() for e in parse_lines(joined.splitlines()) if e.kind in _LOG_KINDS][-20:]


def rank_summary(info: Mapping[str, Any], *, rank: int, out: Path, step: int | None = None,
                 phase: str | None = "user", log_paths: Sequence[str | Path] = ()
                 ) -> dict[str, Any]:
    """The analyzer's per-rank summary from a probe answer. The culprit's line is the
    innermost frame of the user's own code (`user_frame`), else the innermost frame."""
    summary: dict[str, Any] = {
        "rank": rank, "pid": info.get("pid"), "time_s": info.get("time_s"), "step": step,
        "phase": phase, "alive": True, "errors": list(info.get("errors") or ()),
        "artifacts": list(info.get("artifacts") or ()), "pending": list(info.get("pending") or ()),
        "main_stack": info.get("main_stack"),
        "top_of_stack": info.get("user_frame") or info.get("top_frame"),
        "user_frame": info.get("user_frame"), "stacks": dict(info.get("stacks") or {}),
        "process_groups": dict(info.get("process_groups") or {}), "fr_dump": None}
    pkl = out / "fr_trace.pkl"
    if pkl.is_file():
        try:
            raw = pickle.loads(pkl.read_bytes())  # noqa: S301 - written by torch in the rank
            summary["fr_dump"] = trim_dump(raw) if isinstance(raw, Mapping) else None
        except Exception as exc:  # noqa: BLE001 - a torn dump is reported, not raised
            summary["errors"].append(f"fr_dump: {type(exc).__name__}: {exc}")
    try:
        summary["log_errors"] = log_errors(log_paths, out=out)
    except OSError as exc:
        summary["errors"].append(f"logs: {exc}")
    return summary
