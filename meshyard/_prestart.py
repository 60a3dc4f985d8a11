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
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

READY = b"ready\n"
NET_FD_VAR = "MESHYARD_CONFINE_NET_FD"  # workers/host/rankproc.py sets it at spawn


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
