"""Measuring a call's work without a clock: the number of Python lines it executes.

A wall-clock bound is noisy on a shared machine; a line count is the same on every run. The
counter stops the call (raises WorkExceeded) as soon as it passes the budget, so code that
would run for hours fails in milliseconds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class WorkExceeded(AssertionError):
    pass


def lines_executed(fn: Callable[[], Any], *, budget: int) -> int:
    """Runs fn() (its exceptions propagate) and returns how many lines it executed."""
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise WorkExceeded(f"more than {budget} lines executed")
        return local

    def global_(frame: Any, event: str, arg: Any) -> Any:
        return local

    previous = sys.gettrace()
    sys.settrace(global_)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count
