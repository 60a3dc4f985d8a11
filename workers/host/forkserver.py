"""The fork server: worker actor processes forked from one process that imported torch.

A worker actor's process imports torch, torch._dynamo and torch.distributed before its first
step (DDP's constructor reads dynamo's settings): 2-3 CPU-seconds of every actor's start, and
most of it is the same work in every process. Ray starts meshyard's worker actors with
`runtime_env={"py_executable": ...}` (`runtime_env()` below), so the command Ray runs for such
an actor is `workers/host/forkserver_client.py` with Ray's `default_worker.py` and its
arguments. The client asks this server to fork a child, and the child becomes the worker as
`python default_worker.py ARGS` started by Ray would be:

- its standard streams are the client's (passed over the socket), its environment is the
  client's (the whole of it: nothing of the server's start-up environment is left), its
  working directory is the client's (Ray's working_dir put it there), `sys.argv` and
  `sys.path` are what the interpreter's start-up builds from the script and the client's
  PYTHONPATH, numpy's global random state is reseeded (Python's `random` reseeds itself);
- it runs in its own session, and dies with its client: Ray starts, watches and kills the
  client, which forwards the signals it can catch, and the server kills the child when the
  client's connection closes (the client was killed); the client exits with the child's
  status (a signal death included), which the server relays.

The server imports torch (and numpy with OpenBLAS held to one thread) and nothing of Ray
or meshyard's control plane: it starts no thread, holds no socket but its own and no CUDA
context, so what a child inherits is imported code and nothing else. The child sets torch's
and OpenBLAS's thread counts from the OMP_NUM_THREADS Ray gives the actor
(`apply_thread_counts`, from WorkerActor's constructor): libgomp read the variable when the
server imported torch.

One server serves one Ray temp dir, network namespace, mount namespace, Python and meshyard
checkout (forkserver_client.py `socket_path`): its socket lies in Ray's temp dir, which a
confined rank cannot see, and answers only its own uid. It exits once it has had no client
and no child for `IDLE_S` seconds (MESHYARD_FORK_IDLE_S in the starting client's
environment), or once its socket is gone. Where it cannot be reached or started the client
starts the worker as Ray would have (`exec python ARGS`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any, NoReturn

CLIENT = Path(__file__).with_name("forkserver_client.py")
IDLE_S = 30.0


def runtime_env(extra: dict[str, Any] | None = None, *, fork: bool = True) -> dict[str, Any]:
    """A worker actor's runtime_env: `extra` (a working_dir) plus, with `fork` (the
    `fork_workers` setting), the client as Ray's Python."""
    env = dict(extra or {})
    if fork and sys.platform == "linux":
        env["py_executable"] = shlex.join([sys.executable, "-I", "-S", str(CLIENT)])
    return env


def apply_thread_counts() -> None:
    """In a worker forked from the server (torch imported): torch's intra-op threads and
    OpenBLAS's from the environment Ray gave the actor, as a cold import would take them."""
    if "torch" not in sys.modules:
        return
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        sys.modules["torch"].set_num_threads(int(threads))
    from meshyard._prestart import _openblas_threads

    _openblas_threads(os.environ)


# ---- the server -------------------------------------------------------------------------


def serve(path: str, *, idle_s: float = IDLE_S) -> int:
    import selectors
    import signal
    import socket
    import time
    import traceback

    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - DDP / FSDP construction imports it
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    base = sys.path[1:]  # started as `python -m` in ROOT: sys.path[0] is ROOT
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the foreground
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    tmp = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    old = os.umask(0o077)
    try:
        listener.bind(tmp)
    finally:
        os.umask(old)
    listener.listen(64)
    os.rename(tmp, path)  # clients connect only once the imports are done
    ino = os.stat(path).st_ino
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, ("listen", None))
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (client conn, pidfd)
    idle_since = time.monotonic()
    while True:
        if not children:
            if time.monotonic() - idle_since >= idle_s:
                break
            try:
                if os.stat(path).st_ino != ino:
                    break  # another server took the path
            except FileNotFoundError:
                break  # Ray's temp dir was removed
        for key, _ in sel.select(timeout=1.0):
            kind, pid = key.data
            try:
                if kind == "listen":
                    started = _accept(listener, sel, children, base)
                    if started is not None:
                        child, pidfd, conn = started
                        children[child] = (conn, pidfd)
                        sel.register(pidfd, selectors.EVENT_READ, ("child", child))
                        sel.register(conn, selectors.EVENT_READ, ("conn", child))
                elif kind == "child":
                    _reap(pid, children, sel)
                    idle_since = time.monotonic()
                elif kind == "conn":
                    # The client closed its end (it was killed): its worker goes with it;
                    # the child's pidfd then reports the death.
                    sel.unregister(children[pid][0])
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            except Exception:  # noqa: BLE001 - one bad event must not end the server
                traceback.print_exc()
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == ino:
            os.unlink(path)
    return 0


def _reap(pid: int, children: dict[int, Any], sel: Any) -> None:
    """A worker ended: its status to its client, if the client is still there."""
    import json

    conn, pidfd = children.pop(pid)
    sel.unregister(pidfd)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    if conn in sel.get_map():  # not when the client is gone already
        sel.unregister(conn)
        with contextlib.suppress(OSError):
            # the exit code, or -signal: the client exits as the worker did
            conn.send(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
    conn.close()


def _accept(listener: Any, sel: Any, children: dict[int, Any],
            base: list[str]) -> tuple[int, int, Any] | None:
    """One client's request: forks its worker; (pid, pidfd, conn), or None."""
    import array
    import json
    import socket
    import struct

    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    try:
        conn.settimeout(5.0)
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            raise ValueError(f"a client of uid {uid}")
        fds = array.array("i")
        data, ancdata, _flags, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, typ, cdata in ancdata:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
        req = json.loads(data)
        if len(fds) != 3 or not isinstance(req, dict):
            raise ValueError("a request without its three standard streams")
        argv, env, cwd = req["argv"], req["env"], req["cwd"]
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                and isinstance(env, dict) and isinstance(cwd, str)
                and os.path.basename(argv[0]) == "default_worker.py"):
            raise ValueError("a request that is not a Ray worker's")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        _become_worker(argv, {str(k): str(v) for k, v in env.items()}, cwd, list(fds),
                       close=[listener.fileno(), conn.fileno(), sel.fileno(),
                              *[c.fileno() for c, _ in children.values()],
                              *[fd for _, fd in children.values()]],
                       base=base)
    for fd in fds:
        os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        os.kill(pid, 9)  # SIGKILL
        os.waitpid(pid, 0)
        conn.close()
        return None
    with contextlib.suppress(OSError):
        conn.send(json.dumps({"pid": pid}).encode())
    return pid, pidfd, conn


def _become_worker(argv: list[str], env: dict[str, str], cwd: str, fds: list[int], *,
                   close: list[int], base: list[str]) -> NoReturn:
    """In the forked child: Ray's default_worker.py as `python ARGV` in `cwd` with `env`."""
    code = 1
    try:
        import atexit
        import io
        import runpy
        import signal

        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        from meshyard._prestart import _startup_path

        sys.path[:] = _startup_path(os.path.dirname(os.path.abspath(argv[0])),
                                    env.get("PYTHONPATH"), base=base)
        sys.argv = list(argv)
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(1, "w", closefd=False)), write_through=unbuffered)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace",
            write_through=True)
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught one
            import traceback

            traceback.print_exc()
            code = 1
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m workers.host.forkserver")
    p.add_argument("--socket", required=True)
    p.add_argument("--idle-s", type=float, default=IDLE_S)
    a = p.parse_args()
    sys.exit(serve(a.socket, idle_s=a.idle_s))
