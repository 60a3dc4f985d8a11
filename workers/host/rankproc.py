"""One rank process of a user-code job, a child of its worker actor. Linux.

    proc = RankProcess(argv, env=env, cwd=code_dir).start()
    proc.poll() ... proc.terminate(grace_s=3.0)   # the whole tree: SIGTERM, then SIGKILL

* Its own session and process group (`start_new_session`), so signals reach every process
  the rank started and none reach the actor.
* stdout / stderr are the actor's descriptors 1 / 2, which the actor has pointed at the
  rank's log files (workers/host/logcapture.py): C++ output and grandchildren land there too.
* It dies with the actor: the runner sets PR_SET_PDEATHSIG, and the actor is a child
  subreaper, so a grandchild whose parent exited is re-parented to the actor (not to init)
  and `terminate` still finds it among the actor's descendants.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshyard._confine import ConfineError, Plan, apply
from meshyard._prestart import NET_FD_VAR, adopt, preforked_pid, take_preforked

_PR_SET_CHILD_SUBREAPER = 36


def _confine_child(confine: Confinement, cwd: str, report_fd: int) -> None:
    """In the forked child, before exec: confine, then enter `cwd` again as the confined
    view shows it (the code dir bound read-only). A failure is written to `report_fd`."""
    try:
        apply(confine.plan, net_fd=confine.net_fd)
        os.chdir(cwd)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exec refused
        os.write(report_fd, f"{type(exc).__name__}: {exc}".encode()[:4000])
        raise


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (Linux >= 3.4)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _ppids() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[0] != "Z":
            out[int(entry.name)] = int(fields[1])
    return out


# Prestarted rank processes of this actor still waiting for their rank (PrestartedRank): a
# rank's `terminate` / `kill_tree`, which reach every descendant of the actor (what a script
# left behind), spare them.
_WAITING: dict[int, subprocess.Popen[bytes]] = {}


def _spared() -> set[int]:
    """The waiting prestarted processes still running, and the forked one no rank has taken
    yet (meshyard/_prestart.py `PREFORKED`). One that ended on its own is reaped here and
    spared no more: its pid may go to another process from then on."""
    for pid, proc in list(_WAITING.items()):
        if proc.poll() is not None:
            _WAITING.pop(pid, None)
    forked = preforked_pid()
    return set(_WAITING) | ({forked} if forked is not None else set())


def descendants(pid: int) -> set[int]:
    """Every live (non-zombie) process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for child, parent in _ppids().items():
        children.setdefault(parent, []).append(child)
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def alive(pid: int) -> bool:
    """A live process (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _reap(pids: Iterable[int], *, timeout_s: float = 2.0) -> None:
    """Waits (bounded) for `pids` to die and collects those that are children of this
    process (re-parented grandchildren included), so no zombie is left either."""
    todo = set(pids)
    deadline = time.monotonic() + timeout_s
    while todo:
        for p in list(todo):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p, os.WNOHANG)
            if not alive(p):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(p, os.WNOHANG)
                todo.discard(p)
        if not todo or time.monotonic() > deadline:
            return
        time.sleep(0.02)


@dataclass(frozen=True)
class Confinement:
    """A rank's confinement (meshyard/_confine.py): the plan, and the descriptor of the TCP
    layer built for its ports (workers/host/confinement.py `port_layer`)."""

    plan: Plan
    net_fd: int


class RankProcess:
    def __init__(self, argv: list[str], *, env: Mapping[str, str], cwd: str,
                 confine: Confinement | None = None) -> None:
        self.argv, self.env, self.cwd, self.confine = argv, dict(env), cwd, confine
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RankProcess:
        """Starts the process; confined, when asked, between fork and exec: before the
        interpreter reads anything the job controls (LD_PRELOAD, PYTHONPATH, its code).
        Raises ConfineError when the confinement fails (nothing of the job ran)."""
        if self.confine is None:
            self._proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            return self
        read, write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(self.confine.net_fd,),
                preexec_fn=functools.partial(_confine_child, self.confine, self.cwd, write))
        except subprocess.SubprocessError:
            os.close(write)
            write = -1
            why = os.read(read, 4096).decode(errors="replace") or "unknown reason"
            raise ConfineError(f"the rank process could not be confined: {why}") from None
        finally:
            if write >= 0:
                os.close(write)
            os.close(read)
        return self

    @classmethod
    def adopt(cls, proc: subprocess.Popen[bytes], argv: list[str], *,
              env: Mapping[str, str], cwd: str, confine: Confinement | None = None
              ) -> RankProcess:
        """A rank that already runs in `proc` (a PrestartedRank handed its request)."""
        out = cls(argv, env=env, cwd=cwd, confine=confine)
        out._proc = proc
        return out

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def poll(self) -> int | None:
        assert self._proc is not None
        return self._proc.poll()

    def wait(self, timeout_s: float) -> int | None:
        assert self._proc is not None
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, *, grace_s: float) -> None:
        """SIGTERM to the rank's process group and every descendant of this actor, then
        SIGKILL to whatever is left after `grace_s` (a script may save on SIGTERM)."""
        me = os.getpid()
        tree = descendants(me) - _spared()
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGTERM)
        _signal_all(tree, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (descendants(me) & tree or
                                               (self._proc and self._proc.poll() is None)):
            time.sleep(0.05)
        self.kill_tree(known=tree)

    def kill_tree(self, *, known: set[int] | None = None) -> None:
        """SIGKILL to the rank's process group and every descendant of this actor but the
        prestarted rank processes still waiting for a rank."""
        me, spared = os.getpid(), _spared()
        # the tree is read before anything in it dies: a process whose parent is killed
        # first is re-parented away from this actor and would no longer be found below it
        left = (descendants(me) | (known or set())) - spared
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        left |= descendants(me) - spared  # and what was started meanwhile
        _signal_all(left, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        _reap(left)


STOP_GRACE_S = 3.0  # SIGTERM -> SIGKILL of a stopped rank, unless the stop says otherwise


class StopRequest(threading.Event):
    """A worker's stop request (cancel, preemption): set, with the seconds a user-code rank
    gets between SIGTERM and SIGKILL (a preemption gives the job's preemption.grace_s)."""

    def __init__(self) -> None:
        super().__init__()
        self.grace_s = STOP_GRACE_S

    def request(self, grace_s: float | None = None) -> None:
        self.grace_s = STOP_GRACE_S if grace_s is None else max(0.0, float(grace_s))
        self.set()

    def reset(self) -> None:
        self.grace_s = STOP_GRACE_S
        self.clear()


PRESTART = ("-m", "meshyard._prestart")
RUNNER = ("-m", "meshyard.runner")
# Read by the interpreter at start-up (or by the dynamic loader): a rank whose environment
# sets them differently from the prestarted process's starts cold.
_STARTUP_EXACT = ("LD_PRELOAD", "LD_LIBRARY_PATH")
_STARTUP_FREE = ("PYTHONPATH", "PYTHONUNBUFFERED")
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_OWN_VARS = (NET_FD_VAR, "OPENBLAS_NUM_THREADS")


class PrestartedRank:
    """A rank process started before its job (meshyard/_prestart.py): torch imported, waiting
    for one request on its stdin. `hand(...)` turns it into the rank a cold
    `RankProcess(argv, env=env, cwd=cwd).start()` would be, or answers None when it cannot
    (see `fits`), and the caller starts that rank cold."""

    def __init__(self, proc: subprocess.Popen[bytes], *, python: str,
                 env: Mapping[str, str], ports: tuple[int, ...] | None = None) -> None:
        self._proc: subprocess.Popen[bytes] | None = proc
        self.python, self.env, self.ports = python, dict(env), ports
        self._ready, self._pending = False, b""
        _WAITING[proc.pid] = proc

    @classmethod
    def spawn(cls, *, python: str, env: Mapping[str, str], cwd: str,
              net: tuple[int, tuple[int, ...]] | None = None,
              hide: Iterable[str] = (), dynamo: bool = True) -> PrestartedRank:
        """Starts one in its own session with `env` (the worker's allowlisted environment)
        minus the thread-count variables (the rank's own apply at its request; OpenBLAS
        starts no thread before it: a confinement needs a single thread), minus Ray's
        (RAY_*: a token or an address; the rank's own environment has them where the job may
        see them, and the process keeps the one it started with in /proc/self/environ), and
        with PYTHONPATH's entries under `hide` dropped (the user's code must not shadow what
        it imports before its request). `net`: (descriptor, ports) of the TCP layer it
        confines itself with at its request. `dynamo` False: it imports torch and
        torch.distributed only, not torch._dynamo (a process started for one rank's check:
        the rank's code imports what it uses).
        Call it from a thread that lives as long as the actor: the rank sets
        PR_SET_PDEATHSIG, which fires when the thread that started it exits."""
        spawn_env = {k: v for k, v in env.items()
                     if k not in _THREAD_VARS and not k.startswith("RAY_")}
        hidden = {os.path.realpath(h) for h in hide}
        if hidden and spawn_env.get("PYTHONPATH"):
            spawn_env["PYTHONPATH"] = os.pathsep.join(
                p for p in spawn_env["PYTHONPATH"].split(os.pathsep)
                if p and os.path.realpath(p) not in hidden)
        spawn_env.update(PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1")
        if net is not None:
            spawn_env[NET_FD_VAR] = str(net[0])
        argv = [python, *PRESTART, *(() if dynamo else ("--without-dynamo",))]
        proc = subprocess.Popen(argv, env=spawn_env, cwd=cwd,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                start_new_session=True, pass_fds=(net[0],) if net else ())
        return cls(proc, python=python, env=spawn_env, ports=net[1] if net else None)

    @classmethod
    def preforked(cls, *, net: tuple[int, tuple[int, ...]] | None = None
                  ) -> PrestartedRank | None:
        """The rank process the fork server forked with this worker (meshyard/_prestart.py
        `serve_preforked`), handed this process's stderr and `net` (as `spawn`'s); None when
        there is none (a worker Ray started itself, or it was taken) or it is gone. Its
        start-up environment is the fork server's, which `fits` compares as `spawn`'s."""
        taken = take_preforked()
        if taken is None:
            return None
        pid, sock, env = taken
        child = _ForkedChild(pid, sock)
        try:
            if child.poll() is not None:
                raise OSError("it ended")
            adopt(sock, stderr=2, net_fd=net[0] if net else None)
        except OSError:
            _kill(child)  # type: ignore[arg-type]
            return None
        if net is not None:
            env = {**env, NET_FD_VAR: str(net[0])}
        return cls(child, python=sys.executable, env=env,  # type: ignore[arg-type]
                   ports=net[1] if net else None)

    def wait_ready(self, *, timeout_s: float = 120.0) -> bool:
        """Blocks until its imports are done (True), or it died / took too long (False)."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return proc is not None and proc.poll() is None
        if not self._ready:
            self._ready = self._line(timeout_s) == b"ready\n"
        return self._ready and proc.poll() is None

    def _line(self, timeout_s: float) -> bytes | None:
        """The next complete line it wrote to its stdout within `timeout_s`, else None
        (a partial line is kept for the next call)."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return None
        self._pending += _read_line(proc.stdout.fileno(), timeout_s=timeout_s)
        line, sep, rest = self._pending.partition(b"\n")
        if not sep:
            return None
        self._pending = rest
        return line + sep

    def preflight(self, assignment: bytes, *, env: Mapping[str, str], hide: Iterable[str],
                  stop: threading.Event, tick_s: float = 0.2) -> dict[str, Any] | None:
        """Runs the rank's pre-flight check from this process before it becomes the rank
        (meshyard/_prestart.py `_preflight`: in a child it forks): `assignment` is the
        pickled RankAssignment, `env` the rank's environment, `hide` the paths kept off the
        check's import path. Returns its answer ({"out": ...} or {"error": ...}); None when
        the process ended first, or `stop` was set (the process is then retired)."""
        import base64

        def waiting() -> bool:  # False: stopped (the process is retired) or it ended
            if stop.is_set():
                self.close()
            return self._proc is not None and self._proc.poll() is None

        while not self._ready:
            if not waiting():
                return None
            self.wait_ready(timeout_s=tick_s)
        proc = self._proc
        if proc is None or proc.stdin is None:
            return None
        req = {"preflight": base64.b64encode(assignment).decode(), "env": dict(env),
               "hide": [str(h) for h in hide]}
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            return None
        while (line := self._line(tick_s)) is None:
            if not waiting():
                return None
        try:
            answer = json.loads(line)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def returncode(self) -> int | None:
        """Its exit code once it ended by itself (None while it waits, or once handed or
        closed)."""
        return self._proc.poll() if self._proc is not None else None

    def fits(self, argv: list[str], env: Mapping[str, str],
             confine: Confinement | None = None) -> bool:
        return self.misfit(argv, env, confine) is None

    def misfit(self, argv: list[str], env: Mapping[str, str],
               confine: Confinement | None = None) -> str | None:
        """Why a cold start of `argv` with `env` would not run the interpreter set-up this
        process had (None: it would). The runner without interpreter options, the same
        start-up variables, no site hook on the new PYTHONPATH; confined, the same closed
        ports."""
        if self._proc is None or self._proc.poll() is not None:
            return "the prestarted process is gone"
        if confine is not None and confine.plan.denied_ports != self.ports:
            return "its TCP layer closes other ports than the rank's confinement"
        if argv[:3] != [self.python, *RUNNER] or len(argv) < 5:
            return f"interpreter options or another program: {argv[:4]}"
        for k in sorted(set(env) | set(self.env)):
            if k in _STARTUP_FREE or k in _OWN_VARS:
                continue
            if (k.startswith("PYTHON") or k in _STARTUP_EXACT) and env.get(k) != self.env.get(k):
                return f"{k} differs from the prestarted process's"
        if env.get("PYTHONUNBUFFERED") != "1":
            return "PYTHONUNBUFFERED is not 1"
        hooks = ("sitecustomize.py", "usercustomize.py")
        for p in env.get("PYTHONPATH", "").split(os.pathsep):
            for h in hooks:
                if p and Path(p, h).exists():
                    return f"{Path(p, h)} would run at start-up"
        return None

    def hand(self, argv: list[str], *, env: Mapping[str, str], cwd: str, stdout: Path,
             stderr: Path, confine: Confinement | None = None) -> RankProcess | None:
        """Sends the rank's request; the RankProcess now running it, or None (start cold:
        `misfit` says why). With `confine`, the process confines itself first (it fails
        the rank, as a setup error, when it cannot)."""
        if not self.fits(argv, env, confine):
            return None
        proc, self._proc = self._proc, None
        assert proc is not None and proc.stdin is not None
        _WAITING.pop(proc.pid, None)  # the rank's own from here: its end kills it
        if proc.stdout is not None:
            proc.stdout.close()
            proc.stdout = None
        req = {"args": argv[3:], "env": dict(env), "cwd": cwd, "stdout": str(stdout),
               "stderr": str(stderr),
               "confine": confine.plan.to_json() if confine is not None else None}
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            proc.stdin.close()
        except OSError:
            _kill(proc)
            return None
        return RankProcess.adopt(proc, argv, env=env, cwd=cwd, confine=confine)

    def close(self) -> None:
        """Retires it unused: closing its stdin ends it; SIGKILL if it lingers."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _WAITING.pop(proc.pid, None)
            _kill(proc)


class _ForkedChild:
    """A child of this process that subprocess did not start (the preforked rank process),
    with what PrestartedRank and RankProcess use of a Popen: its socket as stdin / stdout,
    `poll`, `wait`, `pid`, `returncode`."""

    def __init__(self, pid: int, sock: int) -> None:
        self.pid, self.returncode = pid, None
        self.stdin: Any = open(os.dup(sock), "wb", buffering=0)  # noqa: SIM115 - kept open
        self.stdout: Any = open(sock, "rb", buffering=0)  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0  # reaped elsewhere: what Popen.poll answers then
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import select

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            pidfd = -1  # gone already: poll below reaps it
        try:
            while (code := self.poll()) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
                if pidfd >= 0:
                    select.select([pidfd], [], [], left)
                else:
                    time.sleep(0.01)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
        return code


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    with contextlib.suppress(OSError):
        if proc.stdout is not None:
            proc.stdout.close()
    try:
        proc.wait(2)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def _read_line(fd: int, *, timeout_s: float) -> bytes:
    import select

    data = b""
    deadline = time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return data
        chunk = os.read(fd, 4096)
        if not chunk:
            return data
        data += chunk
    return data
