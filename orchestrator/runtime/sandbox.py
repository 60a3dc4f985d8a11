"""Confining the processes that run jobs: Landlock keeps them out of the private data dir.

In the embedded mode the Ray processes (GCS, raylet, and the workers that run a job's code)
are the control plane's children, under its OS user, so file modes do not keep them from the
database or admin.token. Landlock (Linux >= 5.13, usable without privileges) does: a thread
restricts itself with a ruleset, and every process it starts afterwards — and everything those
start — inherits the restriction, whatever its user (root included).

The ruleset allows everything except reading, writing or executing files beneath the private
directory; named subdirectories of it (the run dirs, the datasets) stay open. Landlock rules
only grant, so "everything else" is granted piece by piece: every entry beside the path from
`/` down to the private directory gets full access, and the directories on that path may be
listed (names only). Entries created later directly in those directories (`/`, the data dir's
parent) are not covered: a job writes under its run dir.

`ConfinedStarter(fn, ...)` calls fn on a fresh thread that confines itself first, so only
what fn starts is confined, never the calling process; the thread then waits until closed
(see its docstring). Without Landlock it calls fn unconfined and says so
(`Confinement.active` False, with the reason).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # x86_64 and arm64 alike
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1
_CREATE_RULESET_VERSION = 1
_READ_DIR = 1 << 3
_FILE_ONLY = (1 << 0) | (1 << 1) | (1 << 2)  # execute, write, read
_TRUNCATE, _IOCTL_DEV, _REFER = 1 << 14, 1 << 15, 1 << 13


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Confinement:
    active: bool
    detail: str  # what is confined, or why nothing is


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    abi = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def _rights(abi: int) -> tuple[int, int]:
    """(every filesystem right this ABI handles, the subset valid on a regular file)."""
    handled, files = (1 << 13) - 1, _FILE_ONLY
    if abi >= 2:
        handled |= _REFER
    if abi >= 3:
        handled, files = handled | _TRUNCATE, files | _TRUNCATE
    if abi >= 5:
        handled, files = handled | _IOCTL_DEV, files | _IOCTL_DEV
    return handled, files


def _error(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what}: {os.strerror(errno)}")


def _grants(private: Path, open_inside: Iterable[Path]) -> list[tuple[Path, bool]]:
    """(path, full access?) pairs: listing on the way down, everything beside it. Symbolic
    links beside the path get no rule of their own (a rule follows the link, and one
    pointing back into the path, like pytest's `pytest-current`, would open it all); what
    they point to is governed by its own place in the tree."""
    out: list[tuple[Path, bool]] = [(Path("/"), False)]
    here = Path("/")
    for part in private.parts[1:]:
        for entry in sorted(os.listdir(here)):
            if entry != part and not (here / entry).is_symlink():
                out.append((here / entry, True))
        here = here / part
    out += [(p, True) for p in open_inside if p.exists()]
    return out


def confine_this_thread(private: Path, *, open_inside: Iterable[Path] = ()) -> None:
    """Restricts the calling thread (and what it starts from now on): no file beneath
    `private` may be opened, except beneath `open_inside`. Raises OSError without Landlock."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available on this kernel")
    libc = _libc()
    handled, files = _rights(abi)
    attr = _RulesetAttr(handled)
    ruleset = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        private = Path(os.path.realpath(private))
        for path, full in _grants(private, [Path(os.path.realpath(p)) for p in open_inside]):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rights = (handled if path.is_dir() else files) if full else _READ_DIR
                rule = _PathBeneath(rights, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule),
                                0) < 0:
                    raise _error(f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT, ruleset, 0) < 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)


class ConfinedStarter:
    """A thread that confines itself, runs `fn`, and then stays alive until `close()`.

    It must outlive what it started: Ray starts its GCS and raylet with PR_SET_PDEATHSIG,
    which the kernel fires when the *thread* that created them exits, not the process.
    Without Landlock, fn runs unconfined and `confinement` says why."""

    def __init__(self, fn: Callable[[], T], *, private: Path,
                 open_inside: Iterable[Path] = ()) -> None:
        self._fn, self._private, self._inside = fn, private, list(open_inside)
        self._started, self._stop = threading.Event(), threading.Event()
        self._errors: list[BaseException] = []
        self.confinement = Confinement(False, "not started")
        self._thread = threading.Thread(target=self._run, name="meshyard-confined-start",
                                        daemon=True)

    def start(self) -> ConfinedStarter:
        """Runs fn on the thread; returns when it has finished (its exception re-raised)."""
        self._thread.start()
        self._started.wait()
        if self._errors:
            self.close()
            raise self._errors[0]
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            confine_this_thread(self._private, open_inside=self._inside)
            shown = ", ".join(map(str, self._inside)) or "nothing"
            self.confinement = Confinement(True, f"no process started here may open files "
                                           f"beneath {self._private} (except {shown})")
        except OSError as exc:
            self.confinement = Confinement(False, f"not confined: {exc}")
        try:
            self._fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            self._errors.append(exc)
        self._started.set()
        self._stop.wait()


def run_confined(fn: Callable[[], T], *, private: Path,
                 open_inside: Iterable[Path] = ()) -> tuple[T, Confinement]:
    """fn() on a confined thread that ends with it, for work that is over when fn returns
    (processes fn waits for). Its return value (or exception) comes back."""
    result: list[T] = []
    starter = ConfinedStarter(lambda: result.append(fn()), private=private,
                              open_inside=open_inside).start()
    starter.close()
    return result[0], starter.confinement
