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

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from meshyard import _landlock as ll

T = TypeVar("T")


@dataclass(frozen=True)
class Confinement:
    active: bool
    detail: str  # what is confined, or why nothing is


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, disabled)."""
    return ll.abi()


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
    private = Path(os.path.realpath(private))
    with ll.Ruleset(fs=ll.FS_ALL) as rs:
        for path, full in _grants(private, [Path(os.path.realpath(p)) for p in open_inside]):
            rs.allow_path(path, ll.FS_ALL if full else ll.READ_DIR)
        rs.restrict()


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
