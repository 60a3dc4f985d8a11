"""Ray's Python for meshyard's worker actors: `python -I -S forkserver_client.py WORKER ARGS`.

Ray runs this (runtime_env `py_executable`, see workers/host/forkserver.py) where it would run
`python default_worker.py ARGS`. It hands its arguments, environment, working directory and
standard streams to the fork server for this Ray temp dir (starting the server when none
answers), forwards the signals it receives to the forked worker, and exits as the worker did.
Where no server can be reached or started it execs `python default_worker.py ARGS` itself, so
an actor starts either way. Standard library only: it starts for every actor.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_S = 60.0  # the server's start (its torch import) on a loaded node
IDLE_VAR = "MESHYARD_FORK_IDLE_S"  # how long a started server waits for its next client
RANK_VAR = "MESHYARD_FORK_RANK"  # "1": the worker gets a rank process forked with it
MAX_SOCKET_PATH = 107  # sun_path's 108 bytes, NUL included
# What the server keeps of this environment: nothing else is read before a request, and
# each worker replaces the whole environment with its own.
SERVER_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


class Unavailable(Exception):
    pass


def socket_path(temp_dir: str, *, python: str, root: str = ROOT) -> str:
    """The server's socket: one per Ray temp dir, network and mount namespace (a worker
    runs in the server's), Python and meshyard checkout."""
    ns = []
    for kind in ("net", "mnt"):
        try:
            ns.append(os.readlink(f"/proc/self/ns/{kind}"))
        except OSError:
            ns.append("")
    key = "\0".join([os.path.realpath(python), os.path.realpath(root), *ns])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(temp_dir, f"meshyard-fork-{digest}.sock")


def temp_dir(worker_args: list[str]) -> str:
    for arg in worker_args:
        if arg.startswith("--temp-dir="):
            return arg.partition("=")[2]
    raise Unavailable("no --temp-dir in the worker's arguments")


def _seconds(value: str | None) -> bool:
    try:
        return 0.1 <= float(value or "") <= 3600
    except ValueError:
        return False


def _connect(path: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        raise
    return conn


def connect_or_start(path: str, *, python: str) -> socket.socket:
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise Unavailable(f"socket path longer than {MAX_SOCKET_PATH} bytes: {path}")
    with contextlib.suppress(OSError):
        return _connect(path)
    deadline = time.monotonic() + START_S
    with open(f"{path}.lock", "a") as lock:
        while True:  # one client starts the server; the others wait for it here
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Unavailable("another client held the start lock too long") from None
                time.sleep(0.05)
        with contextlib.suppress(OSError):
            return _connect(path)
        env = {k: os.environ[k] for k in SERVER_ENV if k in os.environ}
        env["OPENBLAS_NUM_THREADS"] = "1"  # numpy's pool stays unstarted: forks are safe
        idle = ["--idle-s", os.environ[IDLE_VAR]] if _seconds(os.environ.get(IDLE_VAR)) else []
        with open(path[:-len(".sock")] + ".log", "ab") as log:
            proc = subprocess.Popen(
                [python, "-m", "workers.host.forkserver", "--socket", path, *idle], cwd=ROOT,
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True)
        while True:
            with contextlib.suppress(OSError):
                return _connect(path)
            code = proc.poll()
            if code is not None:
                raise Unavailable(f"the server exited {code} (its log: {log.name})")
            if time.monotonic() > deadline:
                raise Unavailable(f"the server did not listen within {START_S:.0f} s")
            time.sleep(0.05)


def run(conn: socket.socket, worker_args: list[str]) -> int:
    """Hands the worker to the server; returns the status to exit with (-signal: killed).
    A signal that arrives before the worker's pid is known is delivered once it is."""
    worker: list[int] = []
    pending: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        if not worker:
            pending.append(sig)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker[0], sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    # The first line is all the server reads; the environment (Ray's token among it) is
    # read only by the forked worker (forkserver.py, the module doc).
    head = json.dumps({"argv": worker_args, "cwd": os.getcwd(),
                       "rank": os.environ.get(RANK_VAR) == "1"})
    req = head + "\n" + json.dumps(dict(os.environ))
    conn.sendmsg([req.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   array.array("i", [0, 1, 2]))])
    reply = json.loads(conn.recv(1 << 16) or b"{}")
    if "pid" not in reply:
        if pending:  # killed while asking: no worker to start
            return -pending[0]
        raise Unavailable(reply.get("error", "the server closed the connection"))
    worker.append(int(reply["pid"]))
    for sig in pending:
        forward(sig, None)
    try:
        data = conn.recv(1 << 16)
        if data:
            return int(json.loads(data)["status"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    # The server is gone (its worker is not its child any more): wait for the worker itself.
    with contextlib.suppress(OSError):
        pidfd = os.pidfd_open(worker[0])
        select.select([pidfd], [], [])
    return 1


def main(argv: list[str]) -> int:
    worker = argv[1:]
    python = sys.executable
    try:
        conn = connect_or_start(socket_path(temp_dir(worker), python=python), python=python)
        with conn:
            status = run(conn, worker)
    except (OSError, ValueError, Unavailable) as exc:
        sys.stderr.write(f"meshyard: no fork server ({exc}); starting the worker itself\n")
        sys.stderr.flush()
        os.execv(python, [python, *worker])
    if status < 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
