"""The goodput ledger (orchestrator/jobs/goodput.py): buckets add up to the wall time."""

from __future__ import annotations

import pytest

from orchestrator.jobs.goodput import BUCKETS, goodput

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


def _adds_up(g) -> None:
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s)
    assert all(a.end == pytest.approx(b.start) for a, b in zip(g.segments, g.segments[1:],
                                                                strict=False))


RUN = [(0.0, "QUEUED", 0), (1.0, "PLACING", 1), (3.0, "RUNNING", 1)]
LIVE_STEPS = {1: [(s, 4.0 + s) for s in range(1, 11)]}  # steps 1..10 done at 5..14


def test_a_healthy_running_job_has_no_recovering_slice_at_any_moment():
    for now in (6.0, 14.0, 14.5, 20.0):
        steps = {1: [(s, t) for s, t in LIVE_STEPS[1] if t <= now]}
        g = goodput(events=RUN, steps=steps, detections={}, now=now)
        _adds_up(g)
        assert g.seconds["recovering"] == 0 and g.seconds["hung"] == 0, (now, g.seconds)
        assert g.seconds["starting"] == pytest.approx(4.0)  # 1 -> the first step at 5
    g = goodput(events=RUN, steps=LIVE_STEPS, detections={}, now=14.5)
    assert g.seconds["productive"] == pytest.approx(9.5)


def test_a_live_hang_is_hung_from_the_last_step_on_not_recovering():
    # The last step at 14, diagnosed at 30, still stuck at 80 (watchdog action: observe).
    g = goodput(events=RUN, steps=LIVE_STEPS, detections={1: 30.0}, now=80.0)
    _adds_up(g)
    assert g.seconds["hung"] == pytest.approx(66.0) and g.seconds["recovering"] == 0
    assert g.seconds["productive"] == pytest.approx(9.0)


def test_a_hang_that_ended_the_attempt_is_hung_then_recovering():
    events = [*RUN, (40.0, "RESTARTING", 1), (42.0, "PLACING", 2), (44.0, "RUNNING", 2),
              (60.0, "SUCCEEDED", 2)]
    steps = {**LIVE_STEPS, 2: [(s, 40.0 + s) for s in range(9, 20)]}  # 9, 10 redone
    g = goodput(events=events, steps=steps, detections={1: 30.0}, now=100.0)
    _adds_up(g)
    assert g.seconds["hung"] == pytest.approx(16.0)  # 14 -> 30
    assert g.seconds["recovering"] == pytest.approx(10.0 + 2.0 + 7.0)  # 30->40, restart, 42->49
    assert g.seconds["recomputed"] == pytest.approx(1.0) and g.steps_recomputed == 2


def test_a_hang_that_resolved_is_hung_only_between_the_steps_around_it():
    steps = {1: [*LIVE_STEPS[1], (11, 40.0), (12, 41.0)]}
    g = goodput(events=RUN, steps=steps, detections={1: 30.0}, now=41.5)
    _adds_up(g)
    assert g.seconds["hung"] == pytest.approx(26.0)  # step 10 at 14 -> step 11 at 40
    assert g.seconds["recovering"] == 0
    assert g.seconds["productive"] == pytest.approx(9.0 + 1.0 + 0.5)


def test_a_script_job_that_reports_no_steps_progresses_by_its_collectives():
    progress = {1: [(n * 4, 5.0 + n) for n in range(1, 30)]}  # first collective seen at 6
    g = goodput(events=RUN, steps={}, detections={}, now=40.0, progress=progress)
    _adds_up(g)
    assert g.seconds["starting"] == pytest.approx(5.0)
    assert g.seconds["productive"] == pytest.approx(34.0)
    # Without the probe's counts the same job reads as starting throughout.
    g = goodput(events=RUN, steps={}, detections={}, now=40.0)
    assert g.seconds["starting"] == pytest.approx(39.0)


def test_a_script_job_stuck_before_any_progress_is_hung_after_the_diagnosis():
    g = goodput(events=RUN, steps={}, detections={1: 20.0}, now=50.0)
    _adds_up(g)
    assert (g.seconds["starting"], g.seconds["hung"], g.seconds["recovering"]) == (
        pytest.approx(19.0), pytest.approx(30.0), 0)


def test_final_ledger_of_a_failed_hang_adds_up():
    events = [*RUN, (40.0, "FAILED", 1)]
    g = goodput(events=events, steps=LIVE_STEPS, detections={1: 30.0}, now=100.0)
    _adds_up(g)
    assert g.wall_s == pytest.approx(40.0)
    assert (g.seconds["hung"], g.seconds["recovering"]) == (pytest.approx(16.0),
                                                            pytest.approx(10.0))


def test_a_script_without_steps_is_productive_from_its_first_collective() -> None:
    """Rank 0's row of each attempt (its first and latest collective) stands in for steps:
    starting until the first collective, productive after it, hung after the last one once a
    hang was diagnosed."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from orchestrator.jobs.goodput import from_records

    def at(t: float) -> datetime:
        return datetime.fromtimestamp(t, UTC)

    events = [SimpleNamespace(kind="state", dst=d, at=at(t), data={"attempt": 1})
              for t, d in ((100.0, "QUEUED"), (101.0, "PLACING"), (102.0, "STARTING"),
                           (103.0, "RUNNING"))]
    row = SimpleNamespace(rank=0, attempt=1, collectives=840, progress_first_at=at(110.0),
                          progress_at=at(150.0))
    g = from_records(events=events, metrics=[], diagnoses=[], now=160.0, ranks=[row])
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s) == 60.0
    assert g.seconds["starting"] == pytest.approx(9.0)  # placing 101 -> first collective 110
    assert g.seconds["productive"] == pytest.approx(50.0)  # live, not hung: working on
    hung = SimpleNamespace(verdict="HANG", attempt=1, created_at=at(155.0),
                           report={"details": {"detected_at": 155.0}})
    g = from_records(events=events, metrics=[], diagnoses=[hung], now=160.0, ranks=[row])
    assert g.seconds["hung"] == pytest.approx(10.0)  # last progress 150 -> now, still stuck
    silent = SimpleNamespace(rank=0, attempt=1, collectives=None, progress_first_at=None,
                             progress_at=None)
    g = from_records(events=events, metrics=[], diagnoses=[], now=160.0, ranks=[silent])
    assert g.seconds["starting"] == pytest.approx(59.0)  # never seen progressing


def test_a_preemption_is_booked_as_preempted() -> None:
    """Attempt 1 runs steps 1-5, is stopped for another job at 10 (saved at step 5 by 11),
    waits queued until 20, then attempt 2 resumes at step 6 and finishes."""
    events = [(0.0, "QUEUED", 0), (1.0, "PLACING", 1), (2.0, "RUNNING", 1),
              (10.0, "PREEMPTED", 1), (11.0, "QUEUED", 1), (20.0, "PLACING", 2),
              (21.0, "RUNNING", 2), (30.0, "SUCCEEDED", 2)]
    steps = {1: [(s, 3.0 + s) for s in range(1, 6)], 2: [(s, 16.0 + s) for s in range(6, 11)]}
    g = goodput(events=events, steps=steps, detections={}, now=99.0)
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s) == 30.0
    # stopping 10 -> 11, queued 11 -> 20, placing and start of attempt 2 until step 6 at 22
    assert g.seconds["preempted"] == 1.0 + 9.0 + 2.0
    assert g.seconds["starting"] == 3.0 and g.seconds["queued"] == 1.0  # placing -> step 1
    assert g.seconds["productive"] == 4.0 + 2.0 + 4.0 + 4.0  # 4->8, 8->10, 22->26, 26->30
    assert g.seconds["recovering"] == 0.0 and g.seconds["recomputed"] == 0.0
