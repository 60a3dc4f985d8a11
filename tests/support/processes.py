"""Waiting for processes to end, bounded."""

from __future__ import annotations

import time
from collections.abc import Iterable

from workers.host.rankproc import alive


def gone(pids: Iterable[int], *, timeout_s: float = 30.0) -> bool:
    """True once none of `pids` is alive (a zombie counts as gone); False after `timeout_s`."""
    pids = set(pids)
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(p) for p in pids)
