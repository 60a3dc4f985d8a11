"""Where a thread of a rank process is, read from its Python frames: the torch.distributed
call it is blocked in (op, tensor sizes and dtypes, peer, from the frame's locals) and the
innermost frame of the user's own code. Stdlib only, and torch only through `sys.modules`
(nothing here imports it): the probe inside a user's rank process
(meshyard/_probe.py) and the worker's evidence collection (workers/host/evidence.py) share it.

gloo records no send/recv in the Flight Recorder, so the frame locals are the only p2p
evidence there.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")
SCHEDULES_FILE = os.path.join("torch", "distributed", "pipelining", "schedules.py")
P2P_OPS = {"send": "dst", "recv": "src", "isend": "dst", "irecv": "src"}
_GROUP_PEER = {"send": "group_dst", "recv": "group_src", "isend": "group_dst",
               "irecv": "group_src"}
COLLECTIVE_OPS = {
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "reduce", "gather",
    "scatter", "monitored_barrier", "all_gather_object", "broadcast_object_list",
    "_all_gather_base", "_reduce_scatter_base",
}


def c10d_frame(frame: FrameType | None) -> FrameType | None:
    """Outermost torch.distributed API frame (all_reduce, recv, ...) on a thread's stack."""
    found = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(C10D_FILE) and (
                code.co_name in COLLECTIVE_OPS or code.co_name in P2P_OPS):
            found = frame
        frame = frame.f_back
    return found


def group_id(group: Any) -> str:
    if group is None:
        return "0"
    return str(getattr(group, "group_name", None) or "0")


def tensor_meta(t: Any) -> tuple[list[list[int]], list[str]]:
    if t is None:
        return [], []
    tensors = t if isinstance(t, list | tuple) else [t]
    sizes, dtypes = [], []
    for x in tensors:
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            sizes.append([int(s) for s in x.shape])
            dtypes.append(str(x.dtype))
    return sizes, dtypes


def _schedule_p2p(frame: FrameType | None) -> dict[str, Any] | None:
    """A pipeline schedule blocked waiting on its batched send/recv works: the P2POps named
    on the schedule's current line (`_wait_batch_p2p(_batch_p2p(fwd_recvs, ...))`). The wait
    itself is in Work.wait, below any torch.distributed API frame, so only the schedule's
    locals say what it waits for."""
    import linecache

    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(SCHEDULES_FILE):
            line = linecache.getline(code.co_filename, frame.f_lineno)
            if "p2p" in line or "wait" in line:
                for name, value in frame.f_locals.items():
                    if name in line and isinstance(value, list | tuple) and value and all(
                            type(v).__name__ == "P2POp" for v in value):
                        return _p2p_op_dict(value[0])
        frame = frame.f_back
    return None


def _p2p_op_dict(p2p: Any) -> dict[str, Any]:
    fn = getattr(getattr(p2p, "op", None), "__name__", "p2p")
    op = "recv" if "recv" in fn else "send" if "send" in fn else fn
    sizes, dtypes = tensor_meta(getattr(p2p, "tensor", None))
    peer = getattr(p2p, "peer", None)
    return {"op": op, "pg": group_id(getattr(p2p, "group", None)), "seq": None,
            "is_p2p": True, "peer": int(peer) if peer is not None else None, "sizes": sizes,
            "dtypes": dtypes, "source": "stack"}


def pending_op(frame: FrameType | None) -> dict[str, Any] | None:
    """The torch.distributed call a thread is blocked in, from the frame's locals."""
    f = c10d_frame(frame)
    if f is None:
        return _schedule_p2p(frame)
    name = f.f_code.co_name
    loc = dict(f.f_locals)
    tensor = loc.get("tensor", loc.get("tensor_list", loc.get("output_tensor")))
    sizes, dtypes = tensor_meta(tensor)
    op: dict[str, Any] = {"op": name, "pg": group_id(loc.get("group")), "seq": None,
                          "is_p2p": name in P2P_OPS, "peer": None, "sizes": sizes,
                          "dtypes": dtypes, "source": "stack"}
    if name in P2P_OPS:
        peer = loc.get(P2P_OPS[name])
        if peer is None and loc.get(_GROUP_PEER[name]) is not None:
            peer = _global_rank(loc.get("group"), loc[_GROUP_PEER[name]])
        op["peer"] = int(peer) if peer is not None else None
    return op


def _global_rank(group: Any, group_rank: int) -> int | None:
    try:
        dist = sys.modules["torch.distributed"]
        return int(dist.get_global_rank(group, group_rank)) if group is not None else group_rank
    except Exception:  # noqa: BLE001
        return None


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(str(Path(__file__).resolve().parent))  # meshyard itself
    return tuple(sorted(str(Path(d).resolve()) + os.sep for d in dirs if d))


_LIBRARY_DIRS: tuple[str, ...] | None = None


def is_user_file(filename: str) -> bool:
    """A frame of the user's code: not the standard library, not an installed package (torch
    included), not meshyard, not frozen or generated code."""
    global _LIBRARY_DIRS
    if _LIBRARY_DIRS is None:
        _LIBRARY_DIRS = _library_dirs()
    if filename.startswith("<") or "site-packages" in filename or "dist-packages" in filename:
        return False
    try:
        full = str(Path(filename).resolve())
    except OSError:
        return False
    return not full.startswith(_LIBRARY_DIRS)


def user_frame(frame: FrameType | None) -> str | None:
    """The innermost frame of the user's own code on a stack, as "train.py:212 in
    save_checkpoint()" followed by the source line when it can be read."""
    import linecache

    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}()"
            return f"{where}: `{line}`" if line else where
        frame = frame.f_back
    return None


def process_groups(dist: Any) -> dict[str, dict[str, Any]]:
    """The groups of this process (`dist`: its torch.distributed module) keyed like the Flight
    Recorder keys them (group name), with their GLOBAL ranks in group-rank order and their
    description: gloo dumps carry no membership."""
    try:
        c10d = dist.distributed_c10d
        out = {}
        for pg, name in dict(c10d._world.pg_names).items():
            ranks = c10d._world.pg_group_ranks.get(pg, {})
            out[str(name)] = {"ranks": [g for g, _ in sorted(ranks.items(), key=lambda kv: kv[1])],
                              "desc": str(getattr(pg, "group_desc", "") or "")}
        return out
    except Exception:  # noqa: BLE001 - private API; absent means "unknown"
        return {}


Walked = list[tuple[FrameType, int]]  # a thread's frames with their lines, innermost first


def walk_threads(frames: dict[int, FrameType]) -> dict[int, Walked]:
    """Every thread's frame chain (`frames`: `sys._current_frames()`), walked for all threads
    before any source line is read. Reading one stats the file, which releases the GIL: a
    thread that runs meanwhile leaves the frames not walked yet stale (a generator expression
    it has suspended since has no caller, so its stack would end there)."""
    return {ident: list(traceback.walk_stack(frame)) for ident, frame in frames.items()}


def format_walked(walked: Walked) -> str:
    """A walked chain as `traceback.format_stack` prints it, outermost frame first."""
    summary = traceback.StackSummary.extract(iter(walked))
    summary.reverse()
    return "".join(summary.format())


def top_of(walked: Walked) -> str | None:
    """The innermost frame of a walked chain: "train_step at /src/train.py:42"."""
    if not walked:
        return None
    frame, lineno = walked[0]
    return f"{frame.f_code.co_name} at {frame.f_code.co_filename}:{lineno}"


def stacks_by_thread_name(threads: dict[int, Walked], *, training: int | None,
                          skip_current: bool = True) -> dict[str, str]:
    """Every thread's Python stack (`threads`: `walk_threads(sys._current_frames())`) by
    thread name, the `training` thread's name marked " (training)", the calling thread left
    out unless `skip_current` is False. Names, not thread ids, so identical stacks of
    different ranks group together; a repeated name gets " #2", " #3"."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out: dict[str, str] = {}
    for ident, walked in threads.items():
        if skip_current and ident == threading.get_ident():
            continue
        label = names.get(ident, "?") + (" (training)" if ident == training else "")
        n, key = 1, label
        while key in out:
            n += 1
            key = f"{label} #{n}"
        out[key] = format_walked(walked)
    return out
