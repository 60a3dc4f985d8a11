"""Aging: a queued job's effective priority rises with its wait, so nothing waits forever.

Pure. effective = priority + floor(waited_s / AGING_LEVEL_S): one priority level per hour in
the queue. A priority-0 job that has waited three hours sorts with the priority-3 jobs just
submitted, and ahead of them by submission order. Aging only orders the queue (and so decides
which job holds the reservation); preemption compares base priorities, so a long wait never
lets a job stop others.

>>> effective_priority(0, waited_s=3 * 3600 + 5)
3
>>> [j.id for j in age_order([QueuedJob("new", 2, 10_000.0, 1, seq=2),
...                            QueuedJob("old", 0, 0.0, 1, seq=1)], now=10_800.0)]
['old', 'new']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.scheduling.jobs import QueuedJob

AGING_LEVEL_S = 3600.0  # seconds of waiting worth one priority level


def effective_priority(priority: int, *, waited_s: float,
                       level_s: float = AGING_LEVEL_S) -> int:
    if level_s <= 0 or waited_s <= 0:
        return priority
    return priority + math.floor(waited_s / level_s)


def aged(jobs: Sequence[QueuedJob], *, now: float,
         level_s: float = AGING_LEVEL_S) -> list[QueuedJob]:
    """The jobs with their priority replaced by the effective one (for `fair_order`)."""
    return [replace(j, priority=effective_priority(j.priority, waited_s=now - j.submitted_at,
                                                    level_s=level_s)) for j in jobs]


def age_order(jobs: Sequence[QueuedJob], *, now: float,
              level_s: float = AGING_LEVEL_S) -> list[QueuedJob]:
    """Effective priority first (higher first), then submission order. The jobs come back
    with their base priority."""
    eff = {j.id: effective_priority(j.priority, waited_s=now - j.submitted_at, level_s=level_s)
           for j in jobs}
    return sorted(jobs, key=lambda j: (-eff[j.id], j.submitted_at, j.seq))
