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

A client whose environment has MESHYARD_FORK_RANK=1 (`runtime_env(rank=True)`: a worker of a
user-code job, or of a pool that keeps a prestarted rank process) gets one more process: the
child forks, before it reads anything of the request's environment, a rank process
(meshyard/_prestart.py `serve_preforked`) that waits, torch imported, to become the actor's
first user-code rank. It is the worker's own child, as a rank process the actor started would
be, and the actor takes it (workers/host/rankproc.py `PrestartedRank.preforked`) instead of
starting one that imports torch again.

What a request carries is split so that no secret is ever in the server's memory (a rank
process forked from it runs a user's code, and could read what its memory held): the first
line, which the server reads, holds the worker's arguments, working directory and whether it
wants a rank process; the rest, its environment (Ray's token among it), is received into one
buffer that the server zeroes once the child is forked and that the child reads only after a
rank process forked from it has zeroed its own copy.

The server imports torch (and numpy with OpenBLAS held to one thread), the modules a rank
process runs before the user's code (meshyard.runner and its probe), and nothing of Ray
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

from workers.host.forkserver_client import RANK_VAR

CLIENT = Path(__file__).with_name("forkserver_client.py")
IDLE_S = 30.0
MAX_REQUEST = 1 << 20


def runtime_env(extra: dict[str, Any] | None = None, *, fork: bool = True,
                rank: bool = False) -> dict[str, Any]:
    """A worker actor's runtime_env: `extra` (a working_dir) plus, with `fork` (the
    `fork_workers` setting), the client as Ray's Python; with `rank` too, the worker gets a
    rank process forked with it (for an actor that will run a user-code rank)."""
    env = dict(extra or {})
    if fork and sys.platform == "linux":
        env["py_executable"] = shlex.join([sys.executable, "-I", "-S", str(CLIENT)])
        if rank:
            env["env_vars"] = {**env.get("env_vars", {}), RANK_VAR: "1"}
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

    from meshyard import _prestart, _probe, parallel, runner, train  # noqa: F401 - a rank's

    base = sys.path[1:]  # started as `python -m` in ROOT: sys.path[0] is ROOT
    buf = bytearray(MAX_REQUEST)  # every request's environment, zeroed after each fork
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
                    started = _accept(listener, sel, children, base, buf)
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


def _accept(listener: Any, sel: Any, children: dict[int, Any], base: list[str],
            buf: bytearray) -> tuple[int, int, Any] | None:
    """One client's request: forks its worker; (pid, pidfd, conn), or None. Only the
    request's first line is read here (see the module doc); the environment after it stays
    raw bytes in `buf`, zeroed once the child has its copy."""
    import array
    import json
    import socket
    import struct

    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    size = 0
    try:
        conn.settimeout(5.0)
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            raise ValueError(f"a client of uid {uid}")
        fds = array.array("i")
        size, ancdata, flags, _ = conn.recvmsg_into([buf], socket.CMSG_SPACE(3 * fds.itemsize))
        for level, typ, cdata in ancdata:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
        if flags & socket.MSG_TRUNC:
            raise ValueError(f"a request over {MAX_REQUEST} bytes")
        if len(fds) != 3:
            raise ValueError("a request without its three standard streams")
        line = buf.find(b"\n", 0, size)
        if line < 0:
            raise ValueError("a request without its environment")
        head = json.loads(bytes(buf[:line]))
        if not isinstance(head, dict):
            raise ValueError("a request that is not a Ray worker's")
        argv, cwd, rank = head["argv"], head["cwd"], head.get("rank", False)
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                and isinstance(cwd, str) and isinstance(rank, bool)
                and os.path.basename(argv[0]) == "default_worker.py"):
            raise ValueError("a request that is not a Ray worker's")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _zero(buf, size)
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        _become_worker(argv, buf, (line + 1, size), cwd, list(fds), rank=rank,
                       close=[listener.fileno(), conn.fileno(), sel.fileno(),
                              *[c.fileno() for c, _ in children.values()],
                              *[fd for _, fd in children.values()]],
                       base=base)
    _zero(buf, size)
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


def _zero(buf: bytearray, size: int) -> None:
    memoryview(buf)[:size] = bytes(size)


def _environment(buf: bytearray, span: tuple[int, int]) -> dict[str, str]:
    """The request's environment (the bytes after its first line), which `buf` then no
    longer holds. Exits the child, with the reason on its stderr, when it is not one."""
    import json

    try:
        env = json.loads(bytes(buf[span[0]:span[1]]))
        if not (isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ValueError("not an object of strings")
    except ValueError as exc:
        os.write(2, f"meshyard fork server: a request's environment: {exc}\n".encode())
        os._exit(2)
    finally:
        _zero(buf, span[1])
    return env


def _fork_rank(buf: bytearray) -> tuple[int, int, dict[str, str]] | None:
    """In the worker, before it reads its environment: forks the rank process that waits
    for the actor (meshyard/_prestart.py `serve_preforked`). (pid, this side's socket, the
    environment the process started with), or None when it could not be forked."""
    import socket

    try:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return None
    env = dict(os.environ)  # the server's start-up environment (SERVER_ENV): no secret
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        mine.close()
        theirs.close()
        return None
    if pid == 0:
        mine.close()
        from meshyard._prestart import serve_preforked

        serve_preforked(theirs.detach(), scrub=buf, parent=parent)
    theirs.close()
    return pid, mine.detach(), env


def _become_worker(argv: list[str], buf: bytearray, span: tuple[int, int], cwd: str,
                   fds: list[int], *, rank: bool, close: list[int],
                   base: list[str]) -> NoReturn:
    """In the forked child: Ray's default_worker.py as `python ARGV` in `cwd` with the
    environment `buf[span]` holds; with `rank`, a rank process forked first."""
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
        preforked = _fork_rank(buf) if rank else None
        env = _environment(buf, span)
        if preforked is not None:
            from meshyard import _prestart

            _prestart.PREFORKED = preforked
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
        except BaseException as exc:  # noqa: BLE001 - as the interpreter reports an uncaught one
            from meshyard._prestart import exit_status

            code = exit_status(exc)
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
