"""One rank process of a user-code job, a child of its worker actor. Linux.

    proc = RankProcess(argv, env=env, cwd=code_dir).start()
    proc.poll() ... proc.terminate(grace_s=3.0)   # the whole tree: SIGTERM, then SIGKILL

* Its own session and process group (`start_new_session`), so signals reach every process
  the rank started and none reach the actor.
* stdout / stderr are the actor's descriptors 1 / 2, which the actor has pointed at the
  rank's log files (workers/logcapture.py): C++ output and grandchildren land there too.
* It dies with the actor: the runner sets PR_SET_PDEATHSIG, and the actor is a child
  subreaper, so a grandchild whose parent exited is re-parented to the actor (not to init)
  and `terminate` still finds it among the actor's descendants.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


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


class RankProcess:
    def __init__(self, argv: list[str], *, env: Mapping[str, str], cwd: str) -> None:
        self.argv, self.env, self.cwd = argv, dict(env), cwd
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RankProcess:
        self._proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        return self

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
        tree = descendants(me)
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
        """SIGKILL to the rank's process group and every descendant of this actor."""
        me = os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        left = descendants(me) | (known or set())
        _signal_all(left, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        _reap(left)
