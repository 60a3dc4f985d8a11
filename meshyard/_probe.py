"""meshyard's probe inside a rank process of a user's job: progress and evidence for the hang
watchdog without a change to the user's code. Stdlib only; torch is read through
`sys.modules` once the user's code imported it (nothing here imports torch).

The runner (meshyard/runner.py) calls `start()` before the user's code when
MESHYARD_PROBE_DIR is set (the service's worker actor and `meshyard watch` set it, with the
Flight Recorder and NCCL_DEBUG_FILE variables, before the process starts). One daemon thread,
"meshyard-probe", then wakes every `MESHYARD_PROBE_INTERVAL_S` (0.25 s) and

* samples every process group's Flight Recorder watermarks (`_dump_fr_trace` without entries,
  ~0.2 ms) once the default group exists, and rewrites `rank<N>.progress.json` when they move:
  a job that reports no step advances when its collectives do;
* at a normal interpreter exit, records the time and the uncaught exception, if any;
* answers an evidence request: the watcher writes `rank<N>.request` (JSON: `id`, `out`, the
  folder for the answer, and `native`: false leaves py-spy out); the probe writes there
  `stacks.txt` (every thread), `fr_trace.pkl` (the full Flight Recorder dump), `pyspy.txt`
  (py-spy native stacks when py-spy is installed and `native` is not false) and last
  `probe.json` (the op the main thread is blocked in from its frame locals, the innermost
  frame of the user's code, process-group membership, the request id). It answers while
  the main thread is blocked in a collective (the C++ call releases the GIL) or busy in
  Python (the interpreter switches threads every 5 ms).

Idle cost: one `stat()` of the request path per wake, and the watermark read; nothing is
written while nothing moves.

The probe never calls into c10d while the rank tears its process groups down: once
`torch.distributed` is imported, `destroy_process_group` is wrapped (`guard_teardown`) to
hold a lock the probe takes around its own c10d calls, and the probe takes it for good when
the interpreter exits. A Flight Recorder dump from the side thread racing the destruction of
the groups it reads is a lock-order hazard between the recorder and the GIL; the lock keeps
the two apart. The same wrapper holds on to the groups it destroys until the next call or the
interpreter's exit (`_keep_groups`), so a DDP model freed right after the call cannot hang the
rank in ~ProcessGroupGloo; `meshyard.parallel` installs it wherever meshyard creates the
default group (built-in ranks, function jobs), with or without the probe.

Why not torch's `torch.distributed.debug` (torch 2.13): its per-rank C++ `_WorkerServer`
answers `dump_traceback`, `fr_trace_json` and `pyspy_dump` (checked here: it also listens on
a UNIX socket and runs handlers registered with `_register_handler` while the main thread is
blocked). But `start_debug_server()` connects to a TCPStore at MASTER_ADDR:MASTER_PORT before
any rank created one (in the service rank 0's `init_process_group` creates it, inside user
code), binds its workers on every interface without authentication, and needs aiohttp and
Jinja2 for its frontend; the bare `_WorkerServer` is private and experimental, exists only
once torch is imported (a rank hung before that has no server), and would still need a side
thread for the watermark sampling. The probe uses torch's own recorder (`_dump_fr_trace`) and
files next to the rank's report file, which both the worker actor and `meshyard watch` read
without a network listener.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from meshyard import _frames
from meshyard._protocol import (
    ANSWER_FILE,
    FR_TRACE_FILE,
    PROBE_DIR,
    PYSPY_FILE,
    STACKS_FILE,
    progress_path,
    pyspy_path,
    request_path,
)

PROBE_INTERVAL = "MESHYARD_PROBE_INTERVAL_S"
THREAD_NAME = "meshyard-probe"
_DEFAULT_INTERVAL_S = 0.25
_PYSPY_TIMEOUT_S = 10.0



def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as JSON at `path`, whole or not at all: written to a file of this call's own
    (a process's threads may write the same path at once: the probe's thread and its exit
    hook) and renamed over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def _dist() -> Any:
    """torch.distributed when the user's code imported it and created the default group."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist if dist is not None and dist.is_available() and dist.is_initialized() \
            else None
    except Exception:  # noqa: BLE001 - half-imported torch
        return None


# Held by the probe around its calls into c10d and by `destroy_process_group` (re-entrant:
# destroying the default group destroys its subgroups through the same function).
_C10D_LOCK = threading.RLock()
_LOCK_WAIT_S = 5.0


def guard_teardown() -> bool:
    """Wraps torch.distributed's `destroy_process_group` so it runs under `_C10D_LOCK`;
    True once it is wrapped (torch.distributed imported). Idempotent."""
    mod = sys.modules.get("torch.distributed.distributed_c10d")
    original = getattr(mod, "destroy_process_group", None)
    if original is None:
        return False
    if getattr(original, "_meshyard_guarded", False):
        return True

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        with _C10D_LOCK:
            _keep_groups(mod, args[0] if args else kwargs.get("group"))
            return original(*args, **kwargs)

    destroy_process_group._meshyard_guarded = True  # type: ignore[attr-defined]
    mod.destroy_process_group = destroy_process_group  # type: ignore[union-attr]
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group
    return True


# The groups the last `destroy_process_group` call destroyed (`_keep_groups`), let go at the
# interpreter's exit while it is still whole.
_KEPT_GROUPS: list[Any] = []
atexit.register(lambda: _KEPT_GROUPS.clear())


def _keep_groups(mod: Any, group: Any) -> None:
    """Holds a reference to each group `destroy_process_group(group)` is about to destroy,
    so that the user's objects that still hold one (DDP's Reducer, FSDP's state) never drop
    the last one.

    A group's last reference dropped from C++ while the thread holds the GIL (pybind frees a
    Reducer without releasing it) runs ~ProcessGroupGloo there, which joins the gloo worker
    threads; one of them may still be freeing the group's last work, whose tensors need the
    GIL to drop their Python objects: the rank hangs for good after its last step (a DDP
    model freed right after `barrier(); destroy_process_group()`, when its function returns).
    Dropped from Python instead (here, at the next destroy call or at exit), torch's holder
    releases the GIL before the destructor runs."""
    try:
        world = mod._world
        if group is None or group is getattr(mod.GroupMember, "WORLD", None):
            groups = list(world.pg_map)
        else:
            groups = [group] if group in world.pg_map else []
    except Exception:  # noqa: BLE001 - torch's internals moved: destroy as before
        return
    _KEPT_GROUPS[:] = groups  # those of an earlier call go, from Python, without the GIL


def _c10d() -> Any:
    torch_c = sys.modules.get("torch._C._distributed_c10d")
    return torch_c if torch_c is not None and hasattr(torch_c, "_dump_fr_trace") else None


def watermarks() -> dict[str, dict[str, int]]:
    """Per process group (keyed by group name; a rank process is fresh, so the recorder's
    uids are the names): last enqueued and completed collective seq. Raises TimeoutError
    while the groups are being destroyed (nothing is known then; the last record stands)."""
    if not guard_teardown():
        return {}
    if not _C10D_LOCK.acquire(timeout=_LOCK_WAIT_S):
        raise TimeoutError("the process groups are being destroyed")
    try:
        c10d = _c10d()
        if c10d is None or _dist() is None:
            return {}
        raw = pickle.loads(c10d._dump_fr_trace(False, False, False))  # noqa: S301 - torch's
    finally:
        _C10D_LOCK.release()
    out = {}
    for pg, st in (raw.get("pg_status") or {}).items():
        out[str(pg)] = {"enqueued": int(st.get("last_enqueued_collective", -1)),
                        "completed": int(st.get("last_completed_collective", -1))}
    return out


def process_groups() -> dict[str, dict[str, Any]]:
    """This process's groups with their global ranks (`_frames.process_groups`)."""
    dist = _dist()
    return {} if dist is None else _frames.process_groups(dist)


def stack_map(threads: dict[int, _frames.Walked]) -> dict[str, str]:
    """Every thread's Python stack but the probe's, by thread name; the main thread (where
    the user's code runs) named "MainThread (training)"."""
    return _frames.stacks_by_thread_name(threads, training=threading.main_thread().ident)


def collect(out: Path, *, request_id: str, native: bool = True) -> dict[str, Any]:
    """Write this rank's evidence under `out`; `probe.json` last. Never raises. `native`
    False: no py-spy dump (it stops this process while it reads it: seconds with native
    frames), for a request that needs only the collectives' times."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    info: dict[str, Any] = {"id": request_id, "pid": os.getpid(), "time_s": t0, "errors": [],
                            "artifacts": []}
    frames = sys._current_frames()
    main_ident = threading.main_thread().ident or -1
    frame = frames.get(main_ident)
    # Walked now: the main thread runs on while lines are read (see _frames.walk_threads).
    threads = _frames.walk_threads(frames)
    main = threads.get(main_ident, [])
    del frames
    try:
        stacks = stack_map(threads)
        info["stacks"] = stacks
        (out / STACKS_FILE).write_text("\n".join(f"--- {k} ---\n{v}" for k, v in stacks.items()))
        info["artifacts"].append(str(out / STACKS_FILE))
        pending = _frames.pending_op(frame)
        info["pending"] = [pending] if pending else []
        info["user_frame"] = _frames.user_frame(frame)
        info["top_frame"] = _frames.top_of(main)
        info["main_stack"] = _frames.format_walked(main) if main else None
    except Exception as exc:  # noqa: BLE001
        info["errors"].append(f"stacks: {type(exc).__name__}: {exc}")
    del frame, main, threads
    guard_teardown()
    held = _C10D_LOCK.acquire(timeout=_LOCK_WAIT_S)
    try:
        info["initialized"] = _dist() is not None
        if not held:
            info["errors"].append(f"fr_dump: the process groups were being destroyed for "
                                  f"over {_LOCK_WAIT_S:.0f} s")
        else:
            try:
                c10d = _c10d()
                if c10d is not None and info["initialized"]:
                    (out / FR_TRACE_FILE).write_bytes(c10d._dump_fr_trace(True, False, False))
                    info["artifacts"].append(str(out / FR_TRACE_FILE))
            except Exception as exc:  # noqa: BLE001
                info["errors"].append(f"fr_dump: {type(exc).__name__}: {exc}")
        info["process_groups"] = process_groups() if held else {}
    finally:
        if held:
            _C10D_LOCK.release()
    exe = pyspy_path() if native else None
    if exe is not None:
        try:
            res = subprocess.run([exe, "dump", "--native", "--pid", str(os.getpid())],
                                 capture_output=True, text=True, timeout=_PYSPY_TIMEOUT_S,
                                 check=False)
            (out / PYSPY_FILE).write_text(res.stdout + res.stderr)
            info["artifacts"].append(str(out / PYSPY_FILE))
        except (OSError, subprocess.SubprocessError) as exc:
            info["errors"].append(f"py-spy: {exc}")
    info["collect_s"] = round(time.time() - t0, 3)
    write_json_atomic(out / ANSWER_FILE, info)
    return info


class Probe:
    def __init__(self, directory: Path, *, rank: int, interval_s: float) -> None:
        self.dir, self.rank, self.interval_s = directory, rank, interval_s
        self._stop = threading.Event()
        self._last: dict[str, dict[str, int]] | None = None
        # Serializes the progress file's writes; once the exit is recorded nothing else is.
        self._write_lock = threading.Lock()
        self._exited = False
        self._answered: str | None = None
        self.thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)

    def start(self) -> Probe:
        # Before the user's code binds the name (`from torch.distributed import ...`) where
        # torch.distributed is already imported (a rank forked with its worker); otherwise
        # at the first wake that finds it imported.
        guard_teardown()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_progress({})
        self.thread.start()
        atexit.register(self._at_exit)
        return self

    def _at_exit(self) -> None:
        """The process ends through the interpreter (not a signal, not os._exit): record
        when, and the exception that ended it, if any (sys.last_value, set by Python when it
        printed an uncaught exception), so a watcher tells the rank that left from the peers
        that failed of it."""
        self._stop.set()
        # Held from here on: the probe makes no c10d call while the interpreter finalizes
        # (and may destroy the groups the user's code left).
        _C10D_LOCK.acquire(timeout=_LOCK_WAIT_S)
        err = getattr(sys, "last_value", None)
        with self._write_lock, contextlib.suppress(Exception):
            self._exited = True
            write_json_atomic(progress_path(self.dir, self.rank), {
                "pid": os.getpid(), "time": time.time(), "collectives": self._last or {},
                "exited": {"time": time.time(),
                           "error": f"{type(err).__name__}: {err}"[:500] if err else None}})

    def stop(self) -> None:
        self._stop.set()

    def _write_progress(self, marks: dict[str, dict[str, int]]) -> None:
        with self._write_lock:
            if self._exited:  # the exit record is the last word
                return
            write_json_atomic(progress_path(self.dir, self.rank),
                              {"pid": os.getpid(), "time": time.time(), "collectives": marks})
            self._last = marks

    def _loop(self) -> None:
        req = request_path(self.dir, self.rank)
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # the probe never disturbs the user's code
                marks = watermarks()
                # No groups any more after some (the user's code destroyed them): nothing
                # new is known, and the last counts stand for the watcher.
                if marks != self._last and (marks or not self._last):
                    self._write_progress(marks)
            if req.exists():
                with contextlib.suppress(Exception):
                    self._answer(req)

    def _answer(self, req: Path) -> None:
        ask = json.loads(req.read_text())
        rid = str(ask.get("id"))
        if rid == self._answered:
            return
        self._answered = rid
        collect(Path(ask["out"]), request_id=rid, native=ask.get("native") is not False)


_PROBE: Probe | None = None


def start(environ: dict[str, str] | None = None) -> Probe | None:
    """Start the probe thread of this process once (a no-op without MESHYARD_PROBE_DIR)."""
    global _PROBE
    env = os.environ if environ is None else environ
    directory, rank = env.get(PROBE_DIR), env.get("RANK")
    if _PROBE is not None or not directory or rank is None:
        return _PROBE
    try:
        interval = float(env.get(PROBE_INTERVAL) or _DEFAULT_INTERVAL_S)
    except ValueError:
        interval = _DEFAULT_INTERVAL_S
    _PROBE = Probe(Path(directory), rank=int(rank), interval_s=min(max(interval, 0.05), 5.0))
    return _PROBE.start()
