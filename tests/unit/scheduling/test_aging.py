"""Queue order with aging: effective priority = priority + one level per AGING_LEVEL_S waited."""

import pytest

from orchestrator.scheduling.aging import AGING_LEVEL_S, age_order, aged, effective_priority
from tests.unit.scheduling.support import NOW, queued

H = AGING_LEVEL_S


@pytest.mark.parametrize(("priority", "waited", "expected"), [
    (0, 0.0, 0),
    (0, H - 1, 0),
    (0, H, 1),
    (2, 5 * H + 1, 7),
    (-3, 2 * H, -1),
    (4, -10.0, 4),  # a clock behind the submission never lowers it
])
def test_effective_priority(priority, waited, expected):
    assert effective_priority(priority, waited_s=waited) == expected


@pytest.mark.parametrize(("jobs", "expected"), [
    # same priority, same wait: submission order
    ([queued("a", seq=1), queued("b", seq=2)], ["a", "b"]),
    # higher priority first when neither has waited long
    ([queued("low", waited=60), queued("high", priority=1)], ["high", "low"]),
    # two hours of waiting outrank one level of priority (2 > 1)...
    ([queued("high", priority=1, waited=10), queued("old", waited=2 * H + 1)], ["old", "high"]),
    # ...and one hour ties it: the earlier submission goes first
    ([queued("high", priority=1, waited=10), queued("old", waited=H + 1)], ["old", "high"]),
    # half an hour is not enough
    ([queued("high", priority=1, waited=10), queued("old", waited=H / 2)], ["high", "old"]),
])
def test_age_order(jobs, expected):
    assert [j.id for j in age_order(jobs, now=NOW)] == expected


def test_aged_keeps_everything_but_the_priority():
    job = queued("x", priority=1, waited=3 * H, est=50.0)
    (out,) = aged([job], now=NOW)
    assert out.priority == 4
    assert (out.id, out.gpus, out.est_runtime_s, out.submitted_at) == \
        (job.id, job.gpus, job.est_runtime_s, job.submitted_at)


def test_a_starving_job_reaches_the_head_of_any_stream_of_newer_high_priority_jobs():
    # Fresh priority-5 jobs arrive forever; the priority-0 job gets ahead after 5 h of waiting.
    for hours, first in [(4.5, "fresh"), (5.0, "starving")]:
        jobs = [queued("fresh", priority=5, seq=2), queued("starving", waited=hours * H, seq=1)]
        assert age_order(jobs, now=NOW)[0].id == first
