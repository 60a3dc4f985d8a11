"""A gang that slows down together: no rank straggles, no rank stalls, every step just takes
longer (a data-parallel gang over a link that slowed to a crawl: the all-reduce waits on it
in every rank alike). The attempt's baseline is the median step time of its steps after a
warm-up; when the median of the recent steps reaches `ratio` times it, a check is due (the
controller then measures each host's link, orchestrator/runtime/link_probe.py). Checks are
spaced `every_s` apart and at most `max_checks` run per attempt.

>>> w = SlowdownWatch(warmup=2, baseline_n=4, recent_n=3, every_s=60.0)
>>> w.observe([0.05] * 6); w.due(now_s=1.0) is None
True
>>> w.observe([0.40] * 3); w.due(now_s=3.0)
8.0
>>> w.due(now_s=4.0) is None  # the next check 60 s after this one
True
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class SlowdownWatch:
    # A check costs a probe of a few seconds and stores nothing unless a host's link stands
    # out, so the ratio is set low: a loaded host's step times vary by 2x on their own.
    ratio: float = 2.5
    warmup: int = 10  # step times skipped first (compilation, caches, the first sync)
    baseline_n: int = 20
    recent_n: int = 20
    every_s: float = 60.0
    max_checks: int = 3
    _seen: int = 0
    _baseline: list[float] = field(default_factory=list)
    _recent: deque[float] = field(init=False)
    _last_check_s: float | None = None
    _checks: int = 0

    def __post_init__(self) -> None:
        self._recent = deque(maxlen=self.recent_n)

    def observe(self, step_times: Iterable[float]) -> None:
        for t in step_times:
            self._seen += 1
            if self._seen <= self.warmup:
                continue
            if len(self._baseline) < self.baseline_n:
                self._baseline.append(t)
            else:
                self._recent.append(t)

    @property
    def baseline_s(self) -> float | None:
        return statistics.median(self._baseline) if len(self._baseline) >= self.baseline_n \
            else None

    def due(self, *, now_s: float) -> float | None:
        """The recent steps' slowdown against the baseline when a check is due, else None."""
        base = self.baseline_s
        if base is None or base <= 0 or len(self._recent) < self.recent_n:
            return None
        if self._checks >= self.max_checks:
            return None
        if self._last_check_s is not None and now_s - self._last_check_s < self.every_s:
            return None
        slower = statistics.median(self._recent) / base
        if slower < self.ratio:
            return None
        self._last_check_s, self._checks = now_s, self._checks + 1
        return round(slower, 1)
