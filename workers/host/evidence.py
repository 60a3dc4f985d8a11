"""Evidence collection inside a worker process, from a SIDE thread, while the training thread
is blocked inside a collective.

What is collected per rank:
- the Flight Recorder dump: `_dump_nccl_trace` when NCCL is built and in use, else
  `_dump_fr_trace` (gloo), else the dump file NCCL's watchdog wrote
  (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` + rank);
- Python stacks of every thread (sys._current_frames), and the torch.distributed call the
  training thread is blocked in, read from its frame locals (op, tensor sizes, dtype, peer) —
  gloo records no send/recv in the Flight Recorder, so this is the only p2p evidence there;
- py-spy native stacks when the binary is installed;
- the tail of this rank's NCCL_DEBUG_FILE, with the NCCL warnings parsed out.

`announce_collective()` is the other half: called right BEFORE a risky collective it leaves a
small file naming the op, sizes and the seq it will get, because gloo SIGABRTs the process on a
size mismatch and a dead process answers nothing.

Artifacts go under run_dir/diagnostics/<stamp>/rank<N>/ (the layout is
`orchestrator.watchdog.evidence_files`); `collect_evidence()` returns the JSON-able summary
`orchestrator.watchdog.inputs.RankEvidence.from_summary()` reads.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from meshyard import _frames
from meshyard._frames import c10d_frame, group_id, pending_op, tensor_meta
from meshyard._protocol import pyspy_path
from orchestrator.watchdog.evidence_files import (
    rank_dir,
    read_announcement,
    stamp_now,
    write_announcement,
    write_json,
)
from orchestrator.watchdog.flight_recorder import parse_dump, trim_dump
from orchestrator.watchdog.logs import parse_lines

_training_thread: int | None = None
_TORCH: Any = None


def _torch() -> Any:
    """torch, imported once and kept: the worker actor drops the modules a job imported when
    the job ends (warm-pool isolation), and re-importing torch's C extension afterwards fails
    ("bad call flags"), while diagnostics of a failed run still read its Flight Recorder."""
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = torch
    return _TORCH


def mark_training_thread(ident: int | None = None) -> None:
    """Register the thread that runs the training loop (Ray actors do not run it on the
    process's main thread). Without it the thread inside torch.distributed, else main, is used."""
    global _training_thread
    _training_thread = ident if ident is not None else threading.get_ident()


def fr_dump_bytes(*, stack_traces: bool = False) -> bytes | None:
    """The Flight Recorder dump as pickle bytes, or None when no recorder answers.

    Stack traces are off by default: symbolizing them makes the FIRST dump of a process take
    2.5 s (10 s on a loaded 2-core machine, measured with torch 2.13), and the thread stacks
    collected alongside already say where each rank is blocked.
    """
    torch = _torch()
    c10d = torch._C._distributed_c10d
    nccl = getattr(c10d, "_dump_nccl_trace", None)
    if nccl is not None and torch.cuda.is_available():
        try:
            return nccl(True, stack_traces, False)
        except Exception:  # noqa: BLE001 - fall through to the generic recorder
            pass
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is not None:
        try:
            return dump(True, stack_traces, False)
        except Exception:  # noqa: BLE001
            pass
    return _dump_file_bytes()


def _dump_file_bytes() -> bytes | None:
    prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    rank = os.environ.get("RANK")
    if not prefix or rank is None:
        return None
    try:
        return Path(f"{prefix}{rank}").read_bytes()
    except OSError:
        return None


def _target_thread(frames: Mapping[int, FrameType]) -> int:
    if _training_thread in frames:
        return _training_thread  # type: ignore[return-value]
    for ident, frame in frames.items():
        if ident != threading.get_ident() and c10d_frame(frame) is not None:
            return ident
    return threading.main_thread().ident or next(iter(frames))


def process_groups() -> dict[str, dict[str, Any]]:
    """This process's groups with their global ranks (`meshyard._frames.process_groups`)."""
    return _frames.process_groups(_torch().distributed)


def thread_stack_map(*, skip_current: bool = True) -> dict[str, str]:
    """Every thread's Python stack by thread name, the training thread's name marked
    " (training)"; the calling thread (the one answering a diagnostics request) left out.
    Names, not thread ids, so identical stacks of different ranks group together."""
    frames = sys._current_frames()
    return _frames.stacks_by_thread_name(_frames.walk_threads(frames),
                                         training=_target_thread(frames),
                                         skip_current=skip_current)


def thread_stacks() -> tuple[str, dict[str, Any] | None, str | None]:
    """(all threads' stacks as text, pending op of the training thread, its top frame)."""
    frames = sys._current_frames()
    walked = _frames.walk_threads(frames)
    target = _target_thread(frames)
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    top = None
    for ident, chain in walked.items():
        label = "training" if ident == target else "thread"
        stack = _frames.format_walked(chain)
        parts.append(f"--- {label} {names.get(ident, '?')} ({ident}) ---\n{stack}")
        if ident == target:
            top = _frames.top_of(chain)
    return "\n".join(parts), pending_op(frames.get(target)), top


def pyspy_dump(timeout_s: float = 10.0) -> str | None:
    exe = pyspy_path()
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "dump", "--native", "--pid", str(os.getpid())],
                             capture_output=True, text=True, timeout=timeout_s, check=False)
        return res.stdout + res.stderr
    except (OSError, subprocess.SubprocessError) as ex:
        return f"py-spy failed: {ex}"


def nccl_debug_path() -> Path | None:
    """This process's NCCL_DEBUG_FILE with %h (host) and %p (pid) expanded, when it exists."""
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    p = Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))
    return p if p.exists() else None


def tail(path: Path, max_bytes: int = 64 * 1024) -> str:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read().decode("utf-8", errors="replace")


def _log_errors(text: str) -> list[str]:
    kinds = {"nccl_warn", "torch_watchdog_timeout", "gloo_timeout", "collective_mismatch"}
    return [e.describe() for e in parse_lines(text.splitlines()) if e.kind in kinds][-20:]


def collect_evidence(run_dir: str | os.PathLike[str], rank: int, *, stamp: str | None = None,
                     step: int | None = None, phase: str | None = None,
                     log_paths: tuple[str, ...] = (), fr_stack_traces: bool = False,
                     native: bool = True) -> dict[str, Any]:
    """Collect this rank's evidence; never raises (a failing piece is reported in `errors`).
    `native` False leaves out py-spy's dump, which stops the process while it reads it.

    The controller passes one `stamp` to every rank so a diagnosis round shares a folder.
    Stacks are taken first: they are the most time-sensitive piece (a peer's death can unblock
    the training thread). Measured: ~5 ms per rank without FR stack traces.
    """
    t0 = time.time()
    out_dir = rank_dir(run_dir, stamp=stamp or stamp_now(), rank=rank)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
                               "time_s": t0, "step": step, "phase": phase, "alive": True,
                               "errors": [], "artifacts": []}
    _piece(summary, "stacks", lambda: _collect_stacks(out_dir, summary))
    _piece(summary, "fr_dump", lambda: _collect_fr(out_dir, summary, fr_stack_traces))
    _piece(summary, "logs", lambda: _collect_logs(out_dir, summary, log_paths))
    summary["process_groups"] = process_groups()
    if native:
        _piece(summary, "py-spy", lambda: _collect_pyspy(out_dir, summary))
    ann = read_announcement(run_dir, rank)
    if ann is not None:
        summary["pending"] = [*summary.get("pending", []), ann]
    summary["collect_s"] = round(time.time() - t0, 3)
    path = out_dir / "summary.json"
    summary["artifacts"].append(str(path))
    write_json(path, summary)
    return summary


def _piece(summary: dict[str, Any], name: str, fn: Any) -> None:
    try:
        fn()
    except Exception as ex:  # noqa: BLE001 - one broken source must not lose the others
        summary["errors"].append(f"{name}: {type(ex).__name__}: {ex}")


def _collect_fr(out_dir: Path, summary: dict[str, Any], stack_traces: bool) -> None:
    data = fr_dump_bytes(stack_traces=stack_traces)
    if data is None:
        summary["fr_dump"] = None
        return
    (out_dir / "fr_trace.pkl").write_bytes(data)
    summary["artifacts"].append(str(out_dir / "fr_trace.pkl"))
    raw = pickle.loads(data)  # noqa: S301 - bytes produced by torch in this process
    summary["fr_dump"] = trim_dump(raw) if isinstance(raw, Mapping) else None


def _collect_stacks(out_dir: Path, summary: dict[str, Any]) -> None:
    text, pending, top = thread_stacks()
    (out_dir / "stacks.txt").write_text(text)
    summary["artifacts"].append(str(out_dir / "stacks.txt"))
    marker = "--- training"
    summary["main_stack"] = text[text.find(marker):].split("\n--- ", 1)[0] \
        if marker in text else None
    summary["top_of_stack"] = top
    summary["pending"] = [pending] if pending else []


def _collect_pyspy(out_dir: Path, summary: dict[str, Any]) -> None:
    text = pyspy_dump()
    if text is not None:
        (out_dir / "pyspy.txt").write_text(text)
        summary["artifacts"].append(str(out_dir / "pyspy.txt"))


def _collect_logs(out_dir: Path, summary: dict[str, Any], log_paths: tuple[str, ...]) -> None:
    paths = [Path(p) for p in log_paths]
    own = nccl_debug_path()
    if own is not None:
        paths.insert(0, own)
    texts = []
    for p in paths:
        if p.exists():
            texts.append(tail(p))
    if texts:
        joined = "\n".join(texts)
        (out_dir / "nccl_debug_tail.log").write_text(joined)
        summary["artifacts"].append(str(out_dir / "nccl_debug_tail.log"))
        summary["log_errors"] = _log_errors(joined)


def announce_collective(run_dir: str | os.PathLike[str], rank: int, *, op: str,
                        tensor: Any = None, group: Any = None, peer: int | None = None
                        ) -> dict[str, Any]:
    """Record the op this rank is about to run, with the seq it will get on its group.

    The seq is the group's last enqueued collective seq in the Flight Recorder + 1, read from
    the entries (gloo's pg_status counts send/recv too), so it aligns with the other ranks'
    dump entries. Written atomically; a later call replaces it.
    """
    sizes, dtypes = tensor_meta(tensor)
    pg = group_id(group)
    seq = None
    try:
        torch = _torch()
        data = torch._C._distributed_c10d._dump_fr_trace(  # type: ignore[attr-defined]
            True, False, False)
        last = parse_dump(pickle.loads(data)).last_enqueued(pg)  # noqa: S301
        seq = (last or 0) + 1
    except Exception:  # noqa: BLE001 - announce without a seq rather than not at all
        seq = None
    ann = {"op": op, "pg": pg, "seq": seq if peer is None else None, "is_p2p": peer is not None,
           "peer": peer, "sizes": sizes, "dtypes": dtypes, "source": "announce",
           "time_s": time.time()}
    write_announcement(run_dir, rank, ann)
    return ann


def announce_step_collective(op: str, tensor: Any) -> None:
    """Per-step announcement for the training loop's own collective on the default group.

    Cheap (a few us): the position comes from the backend's sequence counter, not from a
    Flight Recorder dump with entries (~150 ms at 2,000 entries). On gloo the counter counts
    every op, send/recv included, exactly like the recorder's `op_id`; the controller turns
    it into the collective seq with the entries of the ranks that answer
    (inputs.resolve_announcements). Other backends count collectives only: that is the seq.
    (pg_status is keyed by an internal uid that does not restart in a reused process, so it
    cannot name this job's default group.) Also registers the calling thread as the training
    thread. A no-op outside a meshyard worker (no MESHYARD_RUN_DIR); never raises."""
    global _training_thread
    _training_thread = threading.get_ident()
    run_dir, rank = os.environ.get("MESHYARD_RUN_DIR"), os.environ.get("RANK")
    if not run_dir or rank is None:
        return
    try:
        dist = _torch().distributed
        pg = dist.distributed_c10d._get_default_group()
        backend = pg._get_backend(tensor.device)
        last = int(backend._get_sequence_number_for_group())
        gloo = "gloo" in str(pg._get_backend_name()).lower()
        sizes, dtypes = tensor_meta(tensor)
        ann = {"op": op, "pg": "0", "seq": None if gloo else last + 1,
               "op_id": last + 1 if gloo else None, "is_p2p": False, "peer": None,
               "sizes": sizes, "dtypes": dtypes, "source": "announce", "time_s": time.time()}
        write_announcement(run_dir, int(rank), ann)
    except Exception:  # noqa: BLE001, S110 - evidence is best effort
        pass
