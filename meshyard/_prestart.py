"""`python -m meshyard._prestart`: a rank process started before its job (the warm pool).

A pooled worker actor starts one of these while it waits for a job (workers/host/rankproc.py,
`PrestartedRank`). It imports torch, torch.distributed, torch._dynamo (which wrapping a model
in DDP or FSDP imports: seconds of a cold script's first step) and the runner, then blocks
reading one request from stdin::

    {"args": ["script", "train.py", "--lr", "1"],   # meshyard.runner's arguments
     "env": {...}, "cwd": "/code", "stdout": "/run/.../rank-0.stdout", "stderr": "..."}

and becomes that rank, as `python -m meshyard.runner ARGS` started cold in `cwd` with `env`
would be: stdin from /dev/null, stdout / stderr appended to the rank's log files, the whole
environment replaced by `env` (nothing of the one it was started with is left: that one is the
worker's allowlisted environment, which holds no secret either), `sys.path` rebuilt from `cwd`
and env's PYTHONPATH as interpreter start-up builds it, torch's thread count from
OMP_NUM_THREADS (libgomp read the variable when torch was imported), then `runner.main`. A
process serves one rank only: it ran no job before, and no job runs in it after.

What a cold start does and this one cannot is decided before the request (the actor then
starts the rank cold): interpreter options (`python -u ...`), PYTHON* variables other than
PYTHONPATH / PYTHONUNBUFFERED, a different LD_PRELOAD / LD_LIBRARY_PATH, a sitecustomize or
usercustomize module on the new PYTHONPATH. No CUDA call is made before the request, so an
idle process holds no GPU memory and CUDA_VISIBLE_DEVICES from `env` decides its devices.

Before that request the actor may send one pre-flight request::

    {"preflight": base64 pickle of the RankAssignment, "env": {the rank's}, "hide": [paths]}

A child forked from this process runs the rank's pre-flight check and this process answers
one JSON line on stdout ({"out": the check's result} or {"error": ...}); the check's process
groups, CUDA context and imports end with the child.

Like the runner, it imports nothing of meshyard's control plane (user packages named `api`,
`workers` or `orchestrator` import as the user's own).

A forked worker actor may get such a process without starting one (`serve_preforked`): its
fork server's child forks it before the worker runs (workers/host/forkserver.py), from a
process that imported torch and holds nothing of any request, and it waits on a socket
instead of a pipe. The actor's first message on it (`adopt`) hands over its stderr and, for a
confined job, the TCP layer; from there it serves exactly as above.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, NoReturn

READY = b"ready\n"
NET_FD_VAR = "MESHYARD_CONFINE_NET_FD"  # workers/host/rankproc.py sets it at spawn


# The rank process the fork server's child forked for this worker actor, until the actor
# takes it: (pid, this side's socket, the environment that process started with).
PREFORKED: tuple[int, int, dict[str, str]] | None = None
_PREFORK_MODULES = ("workers",)  # the fork server's own package: a user's may share the name


def take_preforked() -> tuple[int, int, dict[str, str]] | None:
    """The forked rank process, once (None: none was forked, or it was taken)."""
    global PREFORKED
    out, PREFORKED = PREFORKED, None
    return out


def preforked_pid() -> int | None:
    return PREFORKED[0] if PREFORKED is not None else None


def serve_preforked(sock: int, *, scrub: bytearray, parent: int) -> NoReturn:
    """In the process the fork server's child forked (see the module doc): zero the copy of
    the request buffer this process got, become what `python -m meshyard._prestart` started
    by `parent` would be (its own session, dying with `parent`, the standard streams: the
    socket for stdin and stdout, stderr until the actor's arrives; no other descriptor, no
    module of the fork server's package, default signal handlers), wait for the actor's
    `adopt`, then serve. Exits as that interpreter would: its threads joined, its atexit
    handlers run."""
    memoryview(scrub)[:] = bytes(len(scrub))
    code = 1
    try:
        import ctypes
        import signal
        import socket
        import types

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)  # the worker died before PR_SET_PDEATHSIG took effect
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(sock, 0)
        os.dup2(sock, 1)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        for name in [m for m in sys.modules
                     if m.partition(".")[0] in _PREFORK_MODULES]:
            del sys.modules[name]
        sys.modules["__main__"] = types.ModuleType("__main__")
        sys.argv = [os.path.abspath(__file__)]
        _show_as([sys.executable, "-m", __name__])  # not as the fork server, in ps and /proc
        conn = socket.socket(fileno=0)
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1, 2)
        finally:
            conn.detach()  # fd 0 stays
        if msg != b"A" or not fds:
            os._exit(0)  # the actor closed its end: never adopted
        os.dup2(fds[0], 2)
        os.close(fds[0])
        if len(fds) > 1:
            os.environ[NET_FD_VAR] = str(fds[1])
        _unbuffered_stdio()  # as PYTHONUNBUFFERED=1 (PrestartedRank.spawn's) makes them
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()  # not the fork server's state
        code = _serve(0)
    except BaseException as exc:  # noqa: BLE001 - as the interpreter reports an uncaught one
        code = exit_status(exc)
    finally:
        import atexit
        import threading

        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined] - non-daemon threads, joined
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def exit_status(exc: BaseException) -> int:
    """The status an interpreter exits with when `exc` ends its main module, reported as it
    reports it (a non-integer SystemExit code, or the traceback, on stderr)."""
    if isinstance(exc, SystemExit):
        if isinstance(exc.code, int):
            return exc.code
        if exc.code is not None:
            print(exc.code, file=sys.stderr)
        return 0 if exc.code is None else 1
    import traceback

    traceback.print_exception(exc)
    return 1


def _show_as(argv: list[str]) -> None:
    """Writes `argv` over the command line this process inherited (the memory
    /proc/PID/cmdline reads, /proc/PID/stat's arg_start..arg_end), NUL-padded; a longer one
    is cut to fit."""
    import ctypes

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return
    if end <= start:
        return
    data = "\0".join(argv).encode()[:end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def _unbuffered_stdio() -> None:
    import io

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False),
                                                   write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                                   errors="backslashreplace",
                                                   write_through=True)


def adopt(sock: int, *, stderr: int, net_fd: int | None) -> None:
    """The actor's side: hands the preforked process its stderr and TCP layer."""
    import socket

    with socket.socket(fileno=os.dup(sock)) as conn:
        socket.send_fds(conn, [b"A"], [stderr] + ([net_fd] if net_fd is not None else []))


def _startup_path(cwd: str, pythonpath: str | None, *, base: list[str]) -> list[str]:
    """sys.path as `python -m` started in `cwd` with PYTHONPATH would have it."""
    extra = [p for p in (pythonpath or "").split(os.pathsep) if p]
    return [cwd, *extra, *[p for p in base if p not in extra]]


def _serve(stdin: int = 0, *, dynamo: bool = True) -> int:
    """`dynamo` False (`--without-dynamo`): torch and torch.distributed only, for a process
    started for its rank's pre-flight check; the rank's code imports the rest if it uses it."""
    from meshyard import runner

    runner._die_with_parent()  # MESHYARD_PARENT_PID: the worker actor that started this
    import torch
    import torch.distributed  # noqa: F401

    if dynamo:
        import torch._dynamo  # noqa: F401 - DDP / FSDP construction and optimizers import it
        import torch.nn.parallel  # noqa: F401

    from meshyard import _probe, parallel, train  # noqa: F401

    spawned = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in spawned]
    # stdout is a pipe to the actor until the request (closed when the actor handed the
    # request without waiting for this line)
    with contextlib.suppress(OSError):
        os.write(1, READY)
    req = _request(stdin)
    if req is not None and "preflight" in req:
        _answer(_preflight(req, base=[*spawned, *base]))
        req = _request(stdin)
    if req is None:
        return 0  # the actor closed the pipe: retired without a rank
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, key in ((1, "stdout"), (2, "stderr")):
        target = os.open(req[key], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                         0o600)
        os.dup2(target, fd)
        os.close(target)
    if req.get("confine"):
        failed = _confine(req)
        if failed:
            return failed
    elif os.environ.get(NET_FD_VAR, "").isdigit():
        os.close(int(os.environ[NET_FD_VAR]))  # not confined (trusted): the layer is unused
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[:] = _startup_path(os.getcwd(), os.environ.get("PYTHONPATH"), base=base)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    _openblas_threads(os.environ)
    sys.argv = [runner.__file__, *req["args"]]
    return runner.main(list(req["args"]))


def _request(stdin: int) -> dict[str, Any] | None:
    """The actor's next request line; None when it closed the pipe."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(stdin, 1 << 20)
        if not chunk:
            return None
        data += chunk
    req = json.loads(data)
    return req if isinstance(req, dict) else None


def _answer(out: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        os.write(1, json.dumps(out).encode() + b"\n")


def _preflight(req: dict[str, Any], *, base: list[str]) -> dict[str, Any]:
    """The rank's pre-flight check (workers/host/preflight.py `check_pickled`), run in a child
    forked from this process, which has imported torch and is single-threaded: the check pays
    no import of its own, and this process stays as a cold rank's would be, with no process
    group, Flight Recorder entry or group id used, CUDA context, thread or module of
    meshyard's control plane of the check's. The child runs with the rank's environment (its
    CUDA_VISIBLE_DEVICES decides the device of the check's first CUDA call), one torch thread,
    and meshyard's own import path without the user's code or the spawn directory (`hide`);
    what it prints goes to stderr. Returns {"out": the check's result} or {"error": why there
    is none}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _check_child(req, base=base, answer_fd=write_end)  # never returns
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        return answer
    code = os.waitstatus_to_exitcode(status)
    how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
    return {"error": f"the check's process {how} without an answer"}


def _check_child(req: dict[str, Any], *, base: list[str], answer_fd: int) -> None:
    import base64
    import ctypes
    import importlib
    import signal

    answer: dict[str, Any]
    try:
        with contextlib.suppress(OSError, AttributeError):  # dies with this rank's process
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
        os.dup2(2, 1)  # a print during the check is not the answer
        hidden = {os.path.realpath(h) for h in req.get("hide") or ()}
        hidden.add(os.path.realpath(os.getcwd()))
        os.environ.clear()
        os.environ.update(req.get("env") or {})
        sys.path[:] = [p for p in base if p and os.path.realpath(p) not in hidden]
        import torch

        torch.set_num_threads(1)
        check = importlib.import_module("workers.host.preflight").check_pickled
        answer = {"out": check(base64.b64decode(req["preflight"]))}
    except BaseException as exc:  # noqa: BLE001 - the actor fails the rank with it
        answer = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    try:
        os.write(answer_fd, json.dumps(answer).encode())
    finally:
        os._exit(0)


def _confine(req: dict[str, object]) -> int:
    """Confines this process as the cold start's fork would (meshyard/_confine.py), with
    the TCP layer the actor handed at spawn; 0, or 1 after recording why it could not."""
    from meshyard import _confine as confine
    from meshyard import runner

    try:
        net_fd = int(os.environ.pop(NET_FD_VAR, ""))
    except ValueError:
        net_fd = None
    try:
        confine.apply(confine.Plan.from_json(str(req["confine"])), net_fd=net_fd)
    except confine.ConfineError as exc:
        env = req["env"]
        os.environ[runner.proto.REPORT_FILE] = str(env.get(runner.proto.REPORT_FILE, "")) \
            if isinstance(env, dict) else ""
        runner._fail(exc, setup=True)
        return 1
    return 0


def _openblas_threads(env: dict[str, str] | os._Environ[str]) -> None:
    """OpenBLAS (numpy's) started with one thread so that the process stayed single until
    its confinement; a cold start would have OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS,
    else a thread per CPU. Threads started now are confined like this one."""
    import ctypes

    want = next((int(v) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
                 if (v := env.get(k, "")).isdigit() and int(v) > 0), os.cpu_count() or 1)
    if want == 1:
        return
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1]}
    for lib in sorted(libs):
        try:
            dll = ctypes.CDLL(lib)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                     "openblas_set_num_threads"):
            fn = getattr(dll, name, None)
            if fn is not None:
                fn(ctypes.c_int(want))
                break


if __name__ == "__main__":
    code = _serve(dynamo="--without-dynamo" not in sys.argv[1:])
    sys.stdout.flush()
    sys.exit(code)
