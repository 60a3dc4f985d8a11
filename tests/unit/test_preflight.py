"""The pre-flight verdict (orchestrator/preflight.py) and its restart policy."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import Reason
from orchestrator.preflight import culprits_of, failure_message, slow_links
from orchestrator.runtime.policy import MAX_PREFLIGHT_RESTARTS, Outcome, restart_decision

MB = 1_000_000


def _t(rank: int, src: int, p2p_s: float, **groups: float) -> dict[str, object]:
    return {"rank": rank, "bytes": MB, "p2p": {"src": src, "s": p2p_s},
            "groups": {k.replace("_", ":", 1).replace("_", ","): v for k, v in groups.items()}}


@pytest.mark.parametrize(("timings", "expected"), [
    # rank 1's send starts 0.5 s late: its receiver (rank 2) sees it; 1 is the culprit
    ([_t(0, 3, 0.001), _t(1, 0, 0.001), _t(2, 1, 0.5), _t(3, 2, 0.001)], [("p2p", (1, 2))]),
    # all equal: nothing
    ([_t(0, 1, 0.002), _t(1, 0, 0.002)], []),
    # 10x slower but only by 9 ms: scheduling noise on a small message, not a bad link
    ([_t(0, 2, 0.001), _t(1, 0, 0.010), _t(2, 1, 0.001)], []),
    # a tp group far slower than the other tp group
    ([_t(0, 3, 0.001, tp_0_1=0.4), _t(1, 0, 0.001, tp_0_1=0.4),
      _t(2, 1, 0.001, tp_2_3=0.002), _t(3, 2, 0.001, tp_2_3=0.002)],
     [("all_reduce", (0, 1))]),
    # one group of a dimension: nothing to compare with
    ([_t(0, 1, 0.001, tp_0_1=0.9), _t(1, 0, 0.001, tp_0_1=0.9)], []),
])
def test_slow_links(timings: list[dict[str, object]],
                    expected: list[tuple[str, tuple[int, ...]]]) -> None:
    got = slow_links(timings, min_ratio=0.1)
    assert [(s.kind, s.ranks) for s in got] == expected
    if got:
        msg = failure_message(got)
        assert culprits_of(msg) == sorted({r for s in got for r in s.culprits})
        assert "GB/s" in msg and "median" in msg


def test_preflight_failures_restart_without_counting_max_failures() -> None:
    d = restart_decision(attempt=1, failed=0, preflight_failed=1, max_failures=0,
                         reason=Reason.PREFLIGHT_FAILED, message="p2p 1->0 slow")
    assert d.outcome == Outcome.RESTART and "not counted" in d.message
    last = restart_decision(attempt=5, failed=0, preflight_failed=MAX_PREFLIGHT_RESTARTS + 1,
                            max_failures=3, reason=Reason.PREFLIGHT_FAILED, message="x")
    assert last.outcome == Outcome.FAIL
    assert culprits_of("any other error") == []
