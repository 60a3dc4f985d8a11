"""Ranks that stopped answering the controller's polls for a while and then answered again.

The controller polls every live worker each tick, one after the other, each poll bounded. A
rank whose worker answers no poll for `min_s` while the gang's other ranks keep answering
(another rank answered in the middle of the silence, or answered in a tick where this rank's
poll timed out: `missed`), and then answers again, sat behind a link that dropped and came back
(or on a host too busy to answer): training went on without a restart, and the job's events
say so (`LinkGap`). A gap every rank shares is the controller's own (a slow or loaded control
plane) and is not reported; a rank that never answers again is
the hang watchdog's and the worker-death path's, not this.

>>> g = AnswerGaps(min_s=4.0)
>>> [g.answered(r, at=0.0) for r in (0, 1)]
[None, None]
>>> g.answered(0, at=5.0), g.answered(0, at=10.0)
(None, None)
>>> g.answered(1, at=10.5)  # silent 10.5 s while rank 0 answered twice
10.5
>>> g.answered(0, at=30.0), g.answered(1, at=30.2)  # both silent: the controller's own gap
(None, None)
>>> g.answered(0, at=30.5); g.missed(1); g.answered(0, at=35.6)  # rank 1's poll timed out
>>> g.answered(1, at=35.7)
5.5
>>> g.answered(0, at=50.0); g.silent_for(1, now=51.0), g.silent_for(0, now=51.0)
(15.3, 0.0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

_KEPT = 4  # answer times kept per rank


class AnswerGaps:
    def __init__(self, *, min_s: float = 4.0) -> None:
        self.min_s = min_s
        self._times: dict[int, deque[float]] = {}
        self._missed: set[int] = set()

    def missed(self, rank: int) -> None:
        """`rank`'s poll went unanswered (timed out or failed) in a tick where another rank
        answered."""
        self._missed.add(rank)

    def silent_for(self, rank: int, *, now: float) -> float:
        """How long `rank` has answered no poll while another rank answered well after it (in
        a later tick: a cut-off host); 0.0 when no other rank did (every rank silent: the
        controller's own gap) or `rank` never answered."""
        times = self._times.get(rank)
        if not times:
            return 0.0
        last = times[-1]
        later = last + self.min_s / 2
        if not any(ts and ts[-1] > later for r, ts in self._times.items() if r != rank):
            return 0.0
        return round(max(0.0, now - last), 1)

    def round(self, answered: Mapping[int, float], *, asked: Iterable[int]) -> dict[int, float]:
        """One poll round: each rank in `answered` answered at its time; every other rank in
        `asked` did not (its poll timed out, or failed at once: a connection that broke) and,
        when any rank answered, is `missed`. The gaps the answers end, per rank."""
        gaps = {}
        for rank in sorted(answered, key=lambda r: answered[r]):
            gap = self.answered(rank, at=answered[rank])
            if gap is not None:
                gaps[rank] = gap
        if answered:
            for rank in asked:
                if rank not in answered:
                    self.missed(rank)
        return gaps

    def answered(self, rank: int, *, at: float) -> float | None:
        """Rank `rank`'s worker answered a poll at `at`; the silence it ends when it is a gap
        to report, else None."""
        times = self._times.setdefault(rank, deque(maxlen=_KEPT))
        before = times[-1] if times else None
        times.append(at)
        missed = rank in self._missed
        self._missed.discard(rank)
        if before is None or at - before < self.min_s:
            return None
        if missed:
            return round(at - before, 1)
        # another rank answered in the middle of the silence: the controller was polling
        inside = (before + self.min_s / 2, at - self.min_s / 4)
        if any(inside[0] <= t <= inside[1] for r, ts in self._times.items() if r != rank
               for t in ts):
            return round(at - before, 1)
        return None


def late_answers(served: Mapping[int, Any], arrived: Mapping[int, float], *, sent: float,
                 min_s: float = 4.0) -> dict[int, float]:
    """The ranks of one call round (sent at `sent`) whose answer spent `min_s` or more on the
    way (its arrival less the `served` seconds its worker spent answering) while every other
    answer spent at least `min_s` less: a link that dropped and came back while the call was
    out, when the controller polls no one. Seconds on the way, per such rank.

    >>> late_answers({0: 2.0, 1: 0.5}, {0: 12.2, 1: 10.9}, sent=10.0)  # a slow dump, no gap
    {}
    >>> late_answers({0: 2.0, 1: 0.5}, {0: 12.2, 1: 16.1}, sent=10.0)
    {1: 5.6}
    """
    transit = {r: arrived[r] - sent - float(s) for r, s in served.items()
               if r in arrived and isinstance(s, int | float)}
    out = {}
    for r, t in transit.items():
        others = [x for q, x in transit.items() if q != r]
        if t >= min_s and others and max(others) <= t - min_s:
            out[r] = round(t, 1)
    return out
