"""The watcher's side of the probe inside a user's rank process (meshyard/_probe.py): read its
progress, ask it for evidence, and turn the answer into the per-rank summary the analyzer reads
(`inputs.RankEvidence.from_summary`, the same dict `workers.host.evidence.collect_evidence` returns
for the built-in loop). Pure module: files and pickle, no torch. The worker actor of a rank
(workers/usercode/rank.py) and `meshyard watch` (api/cli/watch_cmds.py) both use it.

    ask(probe_dir, rank, out=diag_dir / f"rank{rank}", request_id=stamp, root=run_dir)
    info = await_answer(out, request_id=stamp, timeout_s=10, root=run_dir)  # None: no answer
    summary = rank_summary(info, rank=rank, out=out, root=run_dir, log_paths=(stderr_log,))

Everything the probe writes is the rank's, and the rank runs the user's code: every file is
read beneath `root` (the run dir) without following a link and up to a size limit
(orchestrator/isolation/runfiles.py), the Flight Recorder dump is unpickled as plain data
only, and a summary's artifacts are the regular files found in the rank's evidence folder,
never a list the rank wrote.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from meshyard._protocol import ANSWER_FILE, PYSPY_FILE, progress_path, request_path
from orchestrator.isolation import runfiles
from orchestrator.watchdog.flight_recorder import trim_dump
from orchestrator.watchdog.logs import parse_lines
from orchestrator.watchdog.stacks import MAX_NATIVE_BYTES

_LOG_KINDS = {"nccl_warn", "torch_watchdog_timeout", "gloo_timeout", "collective_mismatch"}
_TAIL_BYTES = 64 * 1024
_MAX_ANSWER_BYTES = 8 * 2**20  # stacks of every thread, for the largest jobs' ranks
_MAX_DUMP_BYTES = 64 * 2**20  # a Flight Recorder dump of the largest buffers
_MAX_ARTIFACTS = 64
PathLike = str | os.PathLike[str]


def _read_json(root: PathLike, path: Path, *, max_bytes: int = 2**20) -> dict[str, Any] | None:
    data = runfiles.read_json(root, path, max_bytes=max_bytes)
    return data if isinstance(data, dict) else None


def read_progress(probe_dir: str | Path, rank: int, *, root: PathLike) -> dict[str, Any] | None:
    """{"pid", "time", "collectives": {pg: {"enqueued", "completed"}}} or None."""
    return _read_json(root, progress_path(probe_dir, rank))


def enqueued_seqs(collectives: Any) -> dict[str, int]:
    """Per process group, the last collective seq a rank enqueued, as its probe recorded it
    (the file is the job's: entries that are not integers are left out)."""
    out: dict[str, int] = {}
    for pg, st in (collectives.items() if isinstance(collectives, Mapping) else ()):
        n = st.get("enqueued") if isinstance(st, Mapping) else None
        if isinstance(n, int) and not isinstance(n, bool):
            out[str(pg)] = n
    return out


def collective_count(collectives: Mapping[str, Any] | None) -> int | None:
    """One number that grows whenever any of a rank's groups enqueues a collective: the sum
    of the last enqueued seqs (None before the first collective). The file is the job's: the
    count is capped at MAX_COLLECTIVES, which a store's 64-bit column holds."""
    total, seen = 0, False
    for n in enqueued_seqs(collectives).values():
        if n > 0:
            total, seen = min(MAX_COLLECTIVES, total + n), True
    return total if seen else None


MAX_COLLECTIVES = 2**53  # far above any real count; exact in a float and in a BigInteger


def ask(probe_dir: str | Path, rank: int, *, out: Path, request_id: str,
        root: PathLike, native: bool = True) -> None:
    """Ask rank `rank`'s probe for its evidence, to be written under `out` (`native` False:
    without py-spy's dump)."""
    runfiles.replace_text(root, request_path(probe_dir, rank),
                          json.dumps({"id": request_id, "out": str(out), "native": native}))


def await_answer(out: Path, *, request_id: str, timeout_s: float, root: PathLike,
                 poll_s: float = 0.05,
                 alive: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """The probe's answer to `request_id`; None after `timeout_s`, or as soon as `alive()`
    says the rank process is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = _read_json(root, out / ANSWER_FILE, max_bytes=_MAX_ANSWER_BYTES)
        if info is not None and str(info.get("id")) == request_id:
            return info
        if time.monotonic() > deadline or (alive is not None and not alive()):
            return None
        time.sleep(poll_s)


def _tail(root: PathLike, path: PathLike) -> str | None:
    try:
        data = runfiles.tail(root, path, max_bytes=_TAIL_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", errors="replace")


def log_errors(paths: Sequence[PathLike], *, root: PathLike, out: Path | None = None
               ) -> list[str]:
    """NCCL / gloo / torch errors in the tails of `paths` (the tails kept under `out`)."""
    texts = [t for p in paths if (t := _tail(root, p)) is not None]
    if not texts:
        return []
    joined = "\n".join(texts)
    if out is not None:
        runfiles.write_text(root, out / "nccl_debug_tail.log", joined)
    return [e.describe() for e in parse_lines(joined.splitlines()) if e.kind in _LOG_KINDS][-20:]


def _fr_dump(root: PathLike, path: Path) -> dict[str, Any] | None:
    data = runfiles.read_bytes(root, path, max_bytes=_MAX_DUMP_BYTES + 1)
    if len(data) > _MAX_DUMP_BYTES:
        raise ValueError(f"larger than {_MAX_DUMP_BYTES} bytes")
    raw = runfiles.plain_loads(data)
    return trim_dump(raw) if isinstance(raw, Mapping) else None


def artifacts(root: PathLike, out: Path) -> list[str]:
    """The regular files in a rank's evidence folder (what the rank's answer put there)."""
    return [str(out / name) for name in runfiles.list_dir(root, out)
            if runfiles.is_file(root, out / name)][:_MAX_ARTIFACTS]


def rank_summary(info: Mapping[str, Any], *, rank: int, out: Path, root: PathLike,
                 step: int | None = None, phase: str | None = "user",
                 log_paths: Sequence[PathLike] = ()) -> dict[str, Any]:
    """The analyzer's per-rank summary from a probe answer. The culprit's line is the
    innermost frame of the user's own code (`user_frame`), else the innermost frame."""
    summary: dict[str, Any] = {
        "rank": rank, "pid": info.get("pid"), "time_s": info.get("time_s"), "step": step,
        "phase": phase, "alive": True, "errors": list(info.get("errors") or ()),
        "pending": list(info.get("pending") or ()),
        "main_stack": info.get("main_stack"),
        "top_of_stack": info.get("user_frame") or info.get("top_frame"),
        "user_frame": info.get("user_frame"), "stacks": dict(info.get("stacks") or {}),
        "process_groups": dict(info.get("process_groups") or {}), "fr_dump": None}
    pkl = out / "fr_trace.pkl"
    if runfiles.is_file(root, pkl):
        try:
            summary["fr_dump"] = _fr_dump(root, pkl)
        except Exception as exc:  # noqa: BLE001 - a torn or hostile dump is reported, not raised
            summary["errors"].append(f"fr_dump: {type(exc).__name__}: {exc}")
    try:
        summary["log_errors"] = log_errors(log_paths, root=root, out=out)
    except OSError as exc:
        summary["errors"].append(f"logs: {exc}")
    summary["artifacts"] = artifacts(root, out)
    native = out / PYSPY_FILE
    if runfiles.is_file(root, native):  # py-spy's dump, native frames included
        try:
            summary["native"] = runfiles.read_bytes(root, native, max_bytes=MAX_NATIVE_BYTES
                                                    ).decode("utf-8", "replace")
        except OSError as exc:
            summary["errors"].append(f"py-spy: {exc}")
    return summary
