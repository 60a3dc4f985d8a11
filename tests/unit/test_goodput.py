"""The goodput ledger (orchestrator/goodput.py): buckets add up to the wall time."""

from __future__ import annotations

import pytest

from orchestrator.goodput import BUCKETS, goodput

RESTART = [(0.0, "QUEUED", 0), (1.0, "PLACING", 1), (2.0, "STARTING", 1),
           (3.0, "RUNNING", 1), (20.0, "RESTARTING", 2 - 1), (21.0, "QUEUED", 1),
           (22.0, "PLACING", 2), (23.0, "STARTING", 2), (24.0, "RUNNING", 2),
           (40.0, "SUCCEEDED", 2)]
# attempt 1: steps 1-10 done by t=14, hung until the diagnosis at 17, killed at 20
# attempt 2: resumed from the step-6 checkpoint: steps 7-10 redone, then 11-20
STEPS = {1: [(s, 4.0 + s) for s in range(1, 11)],
         2: [(s, 25.0 + (s - 7)) for s in range(7, 21)]}


def test_a_job_with_a_restart_adds_up() -> None:
    g = goodput(events=RESTART, steps=STEPS, detections={1: 17.0}, now=99.0)
    assert g.wall_s == 40.0
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s)
    assert set(g.seconds) == set(BUCKETS)
    s = g.seconds
    assert s["queued"] == 1.0
    assert s["starting"] == 1.0 + 1.0 + 2.0  # placing, starting, running until step 1 at 5.0
    assert s["hung"] == 3.0  # last step at 14, detected at 17
    # diagnosis -> kill 3 s, RESTARTING 1 s, queued 1, placing 1, starting 1, first step 1
    assert s["recovering"] == 3.0 + 1.0 + 1.0 + 1.0 + 1.0 + 1.0
    assert s["recomputed"] == 3.0  # steps 7..10 redone: 25 -> 28
    assert s["productive"] == 9.0 + 10.0 + 2.0  # 5->14, 28->38, 38->40 (final save, exit)
    assert g.steps_recomputed == 4
    assert g.ratio == pytest.approx(21.0 / 40.0)
    kinds = [x.kind for x in g.segments]
    assert kinds[:3] == ["queued", "starting", "productive"]
    assert [x.start for x in g.segments] == sorted(x.start for x in g.segments)
    assert all(a.end == b.start for a, b in zip(g.segments[:-1], g.segments[1:], strict=True))  # contiguous


@pytest.mark.parametrize(("events", "now", "wall", "bucket"), [
    ([(0.0, "QUEUED", 0)], 5.0, 5.0, "queued"),  # still waiting: counts to now
    ([(0.0, "QUEUED", 0), (2.0, "PLACING", 1), (3.0, "CANCELLING", 1),
      (4.0, "CANCELLED", 1)], 9.0, 4.0, "stopping"),
    ([(0.0, "QUEUED", 0), (1.0, "PLACING", 1), (2.0, "RUNNING", 1), (6.0, "FAILED", 1)],
     9.0, 6.0, "starting"),  # a crash before any step: all of it was start-up
])
def test_edges_add_up(events: list[tuple[float, str, int]], now: float, wall: float,
                      bucket: str) -> None:
    g = goodput(events=events, steps={}, detections={}, now=now)
    assert g.wall_s == wall and sum(g.seconds.values()) == pytest.approx(wall)
    assert g.seconds[bucket] > 0


def test_steps_before_the_running_event_still_count() -> None:
    """The poller writes RUNNING when it first sees a step: steps and the stall before it
    (a hang at step 3, seen in the same poll as step 1) are still split by the steps."""
    events = [(0.0, "QUEUED", 0), (1.0, "PLACING", 1), (2.0, "STARTING", 1),
              (9.0, "RUNNING", 1), (12.0, "RESTARTING", 1), (12.5, "FAILED", 1)]
    g = goodput(events=events, steps={1: [(1, 4.0), (2, 5.0)]}, detections={1: 8.0}, now=20)
    assert g.seconds["hung"] == 3.0 and g.seconds["productive"] == 1.0
    assert g.seconds["starting"] == 3.0 and g.seconds["recovering"] == 4.0 + 0.5
    assert sum(g.seconds.values()) == g.wall_s == 12.5
