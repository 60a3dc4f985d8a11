"""Compact integer ranges for people: ranks and GPU indices. Pure module.

>>> format_ranges([0, 1, 2, 5])
'0-2,5'
>>> format_ranges([6, 0, 1, 2, 3], dash="–", sep=", ")
'0–3, 6'
"""

from __future__ import annotations

from collections.abc import Iterable


def format_ranges(values: Iterable[int], *, dash: str = "-", sep: str = ",",
                  empty: str = "") -> str:
    """Sorted distinct values with runs of consecutive ones as `first<dash>last`."""
    parts: list[str] = []
    run: list[int] = []
    for v in sorted(set(values)):
        if run and v != run[-1] + 1:
            parts.append(_run(run, dash))
            run = []
        run.append(v)
    if run:
        parts.append(_run(run, dash))
    return sep.join(parts) or empty


def _run(run: list[int], dash: str) -> str:
    return f"{run[0]}{dash}{run[-1]}" if len(run) > 1 else str(run[0])
