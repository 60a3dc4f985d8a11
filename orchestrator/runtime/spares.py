"""Spare controllers: attempt controllers started before an attempt needs one.

Starting a controller is a new Ray worker process (Python, Ray and the controller's modules:
about half a second here); a spare has done that already, so the scheduler's launch is one
`adopt(config)` call. The scheduler takes a spare for each launch and the runtime keeps
`size` of them (scheduler loop, `top_up`), next to the control plane like any controller.
A spare is taken only once it has answered its first call: one whose worker process is
still starting (a loaded host can take tens of seconds) or that died is passed over, and the
launch starts a controller of its own rather than wait on it.

A spare is a detached actor named `events.spare_controller_name(token)`; adopted, it keeps
that name, and the attempt's placement records it (`placement["controller"]`) before the
spare is told its attempt, so a restarted control plane finds it as it finds any controller.
The orphan sweep (poller.py) kills a spare that is neither recorded by a live attempt nor
held here: the spares of a control plane that died. `close()` kills the ones held here.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from typing import Any

import ray

from orchestrator.runtime.controller import RemoteController, controller_options
from orchestrator.runtime.events import spare_controller_name


class SpareControllers:
    """`size` spare controllers next to `near_node_id`. Thread-safe: the scheduler takes
    them, the sweep reads `names()`."""

    def __init__(self, size: int, *, near_node_id: str | None) -> None:
        self.size = size
        self.near_node_id = near_node_id
        self._lock = threading.Lock()
        # (name, handle, the first call's reply: ready once the actor runs)
        self._idle: list[tuple[str, Any, Any]] = []
        self._taken: dict[str, Any] = {}  # taken for a launch that has not finished yet
        self._starting: set[str] = set()

    def top_up(self) -> int:
        """Starts spares until `size` are idle; returns how many it started (the actors
        start in the background; each is sent one call at once, so that Ray's set-up of an
        actor's first call is done before a launch calls it)."""
        started = 0
        while True:
            name = spare_controller_name(secrets.token_hex(6))
            with self._lock:
                if len(self._idle) + len(self._starting) >= self.size:
                    return started
                self._starting.add(name)  # named before it exists: the sweep spares it
            try:
                handle = RemoteController.options(  # type: ignore[attr-defined]
                    **self._options(name)).remote()
                # An actor's first method call costs Ray 0.13-0.17 s here beyond the call
                # itself (measured; later calls take a few ms): paid now, not by the
                # launch's `adopt`; its reply says the spare is up.
                first = handle.poll.remote()
            finally:
                with self._lock:
                    self._starting.discard(name)
            with self._lock:
                self._idle.append((name, handle, first))
            started += 1

    def _options(self, name: str) -> dict[str, Any]:
        return controller_options(name, self.near_node_id)

    def take(self) -> tuple[str, Any] | None:
        """The oldest idle spare that is up (name, handle), held as taken until
        `done(name)`; None when none is. A spare whose first call failed (its actor died) is
        dropped and killed; `top_up` replaces it."""
        with self._lock:
            idle = list(self._idle)
        for name, handle, first in idle:
            up = _answered(first)
            if up is None:
                continue  # still starting
            with self._lock:
                left = [s for s in self._idle if s[0] != name]
                if len(left) == len(self._idle):
                    continue  # taken meanwhile
                self._idle = left
                if up:
                    self._taken[name] = handle
                    return name, handle
            _kill(handle)
        return None

    def ready(self) -> set[str]:
        """The idle spares that are up: the ones `take` hands out."""
        with self._lock:
            idle = list(self._idle)
        return {name for name, _, first in idle if _answered(first)}

    def done(self, name: str, *, adopted: bool) -> None:
        """The launch that took `name` finished; a spare it did not adopt is killed."""
        with self._lock:
            handle = self._taken.pop(name, None)
        if handle is not None and not adopted:
            _kill(handle)

    def names(self) -> set[str]:
        """Spares held here (idle or being adopted): not orphans."""
        with self._lock:
            return {n for n, _, _ in self._idle} | set(self._taken) | self._starting

    def close(self) -> int:
        """Kills the idle spares; returns how many."""
        with self._lock:
            idle, self._idle = self._idle, []
        for _, handle, _ in idle:
            _kill(handle)
        return len(idle)


def _answered(first: Any) -> bool | None:
    """Whether a spare's first call was answered (True) or failed (False); None: not yet."""
    ready, _ = ray.wait([first], timeout=0)
    if not ready:
        return None
    try:
        ray.get(first, timeout=0)
    except Exception:  # noqa: BLE001 - whatever ended the actor, it is no spare
        return False
    return True


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):  # already gone is fine
        ray.kill(handle, no_restart=True)
