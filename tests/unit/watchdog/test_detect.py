"""Stall / dead / silent / straggler policies (pure; decisions only)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.watchdog.detect import (
    RankProgress,
    StallPolicy,
    StragglerPolicy,
    evaluate_stall,
    find_stragglers,
    p95,
    stall_threshold,
    straggler_scores,
)

POLICY = StallPolicy(floor_s=10.0, k=5.0, first_step_timeout_s=120.0, heartbeat_timeout_s=15.0)


def ranks(step_changed: float, n: int = 4, hb: float = 100.0) -> list[RankProgress]:
    return [RankProgress(rank=r, step=7, step_changed_s=step_changed, heartbeat_s=hb)
            for r in range(n)]


def test_p95_nearest_rank() -> None:
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([]) is None
    assert p95([3.0]) == 3.0


def test_threshold_is_floor_or_k_times_p95() -> None:
    assert stall_threshold(POLICY, []) == 10.0
    assert stall_threshold(POLICY, [0.5] * 50) == 10.0
    assert stall_threshold(POLICY, [4.0] * 50) == 20.0


def test_stalled_when_no_rank_advanced_for_the_threshold() -> None:
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=ranks(89.0),
                       step_times=[1.0] * 20)
    assert (d.stalled, d.reason, d.threshold_s, d.idle_s) == (True, "stall", 10.0, 11.0)
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=ranks(91.0),
                       step_times=[1.0] * 20)
    assert not d.stalled and not d.needs_diagnosis


def test_one_rank_advancing_means_not_stalled() -> None:
    rs = ranks(50.0)
    rs[2] = RankProgress(rank=2, step=9, step_changed_s=99.0, heartbeat_s=100.0)
    assert not evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs,
                              step_times=[1.0]).stalled


def test_first_step_uses_the_longer_threshold() -> None:
    rs = [RankProgress(rank=r, step=None, step_changed_s=None, heartbeat_s=59.0)
          for r in range(2)]
    d = evaluate_stall(POLICY, now_s=60.0, started_s=0.0, ranks=rs, step_times=[])
    assert not d.stalled and d.threshold_s == 120.0
    d = evaluate_stall(POLICY, now_s=121.0, started_s=0.0, ranks=rs, step_times=[])
    assert d.stalled and d.reason == "first_step"


def test_dead_and_silent_ranks() -> None:
    rs = ranks(99.0)
    rs[1] = RankProgress(rank=1, step=7, step_changed_s=99.0, heartbeat_s=80.0)
    rs[3] = RankProgress(rank=3, step=7, step_changed_s=99.0, heartbeat_s=99.0, alive=False)
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs, step_times=[1.0])
    assert (d.stalled, d.dead_ranks, d.silent_ranks) == (False, (3,), (1,))
    assert d.needs_diagnosis


def test_fixed_policy_from_spec() -> None:
    p = StallPolicy.fixed(3.0)
    assert (p.floor_s, p.k, p.first_step_timeout_s) == (3.0, 0.0, 30.0)
    assert p.checkpoint_timeout_s == 30.0  # like the first step unless given
    assert StallPolicy.fixed(3.0, 120.0, checkpoint_timeout_s=600.0).checkpoint_timeout_s == 600
    assert stall_threshold(p, [100.0] * 10) == 3.0


def test_a_checkpoint_save_is_held_to_its_own_threshold_from_its_start() -> None:
    """Ranks stepped last at 40 and began a save at 50: the checkpoint threshold (300 s)
    runs from 50, not the stall one (10 s) from 40."""
    rs = [RankProgress(rank=r, step=7, step_changed_s=40.0, heartbeat_s=99.0,
                       checkpoint_s=50.0 + r) for r in range(2)]
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs, step_times=[1.0])
    assert (d.stalled, d.threshold_s, d.idle_s) == (False, 300.0, 49.0)
    d = evaluate_stall(POLICY, now_s=352.0, started_s=0.0, ranks=rs, step_times=[1.0])
    assert (d.stalled, d.reason) == (True, "checkpoint")
    # One rank still saving is enough: the others wait for it in the save's collectives.
    rs[0] = RankProgress(rank=0, step=7, step_changed_s=40.0, heartbeat_s=99.0)
    assert not evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs,
                              step_times=[1.0]).stalled
    # A dead rank's save holds nothing up.
    rs = [RankProgress(rank=r, step=7, step_changed_s=40.0, heartbeat_s=99.0,
                       checkpoint_s=50.0, alive=r == 0) for r in range(2)]
    rs[0] = RankProgress(rank=0, step=7, step_changed_s=40.0, heartbeat_s=99.0)
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs, step_times=[1.0])
    assert (d.stalled, d.reason, d.threshold_s) == (True, "stall", 10.0)


def test_ranks_that_all_finished_are_neither_stalled_nor_silent() -> None:
    """The last heartbeats said "done" long ago, and the run results are not in yet (a
    loaded host): the job is ending, not hung. One rank still training keeps the rule."""
    rs = [RankProgress(rank=r, step=7, step_changed_s=40.0, heartbeat_s=41.0, done=True)
          for r in range(2)]
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs, step_times=[1.0])
    assert (d.stalled, d.reason, d.silent_ranks, d.needs_diagnosis) == (False, "", (), False)
    rs[1] = RankProgress(rank=1, step=7, step_changed_s=40.0, heartbeat_s=99.0)
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs, step_times=[1.0])
    assert (d.stalled, d.reason, d.silent_ranks) == (True, "stall", ())


def test_a_finished_checkpoint_restarts_the_clock() -> None:
    """The save ended at 95: the next step has the stall threshold from then."""
    rs = [RankProgress(rank=r, step=7, step_changed_s=40.0, heartbeat_s=99.0,
                       checkpoint_done_s=95.0) for r in range(2)]
    d = evaluate_stall(POLICY, now_s=100.0, started_s=0.0, ranks=rs, step_times=[1.0])
    assert (d.stalled, d.threshold_s, d.idle_s) == (False, 10.0, 5.0)
    assert evaluate_stall(POLICY, now_s=106.0, started_s=0.0, ranks=rs,
                          step_times=[1.0]).reason == "stall"
    # A resume's load that ended at 95 leaves the first step its whole threshold.
    rs = [RankProgress(rank=r, step=None, step_changed_s=None, heartbeat_s=99.0,
                       checkpoint_done_s=95.0) for r in range(2)]
    d = evaluate_stall(POLICY, now_s=200.0, started_s=0.0, ranks=rs, step_times=[])
    assert (d.stalled, d.threshold_s, d.idle_s) == (False, 120.0, 105.0)


def enter_times(late: dict[int, float], n: int = 20, world: int = 4,
                jitter: float = 0.002) -> dict[int, dict[tuple[str, int], float]]:
    return {r: {("0", s): s * 1.0 + (r % 3) * jitter + late.get(r, 0.0)
                for s in range(1, n + 1)} for r in range(world)}


def test_straggler_found_by_time_to_enter() -> None:
    scores = straggler_scores(enter_times({2: 0.3}))
    assert find_stragglers(scores) == (2,)
    s2 = next(s for s in scores if s.rank == 2)
    assert s2.late_fraction == 1.0 and abs(s2.median_lateness_s - 0.3) < 0.01


def test_rank0_straggler_in_two_rank_world() -> None:
    assert find_stragglers(straggler_scores(enter_times({0: 0.4}, world=2))) == (0,)


def test_a_lag_that_is_a_small_share_of_the_step_is_not_a_straggler() -> None:
    # 100 ms late in every 1 s step: last every time, far above the peers' spread, but it
    # costs the job a tenth of its time; the rank's own interval between collectives says so.
    scores = straggler_scores(enter_times({0: 0.1}, world=2))
    assert scores[0].cadence_s == pytest.approx(1.0) and scores[0].late_fraction == 1.0
    assert find_stragglers(scores) == ()
    assert find_stragglers(scores, StragglerPolicy(min_step_fraction=0.0)) == (0,)


def noisy_job(*, world: int, steps: int, step_s: float, jitter_s: float,
              late: dict[int, float], seed: int) -> dict[int, dict[tuple[str, int], float]]:
    """Enter times of a job on a loaded host: every rank's step takes step_s plus uniform
    jitter; `late` ranks do that much more work before each collective."""
    rnd = random.Random(seed)
    out: dict[int, dict[tuple[str, int], float]] = {r: {} for r in range(world)}
    t = 0.0
    for s in range(1, steps + 1):
        enters = {r: t + step_s + rnd.uniform(0, jitter_s) + late.get(r, 0.0)
                  for r in range(world)}
        for r, e in enters.items():
            out[r][("0", s)] = e
        t = max(enters.values())  # the all_reduce ends when the last rank entered
    return out


# What the hang monitor asks of a straggler (orchestrator/watchdog/monitor.py).
MONITOR = StragglerPolicy(min_samples=8, min_late_fraction=0.75, min_lateness_s=0.05,
                          min_ratio=3.0, min_spread_s=0.05)


@pytest.mark.parametrize("seed", range(5))
def test_healthy_noisy_jobs_have_no_straggler(seed: int) -> None:
    # Rank 0 logs 60 ms per 0.35 s step and the host adds up to 0.1 s of jitter: rank 0
    # is last most of the time and, among the collectives spread wider than 50 ms, by more
    # than the 50 ms floor, yet healthy.
    times = noisy_job(world=2, steps=60, step_s=0.3, jitter_s=0.1, late={0: 0.06},
                      seed=seed)
    scores = straggler_scores(times, min_spread_s=MONITOR.min_spread_s)
    assert find_stragglers(scores, MONITOR) == ()
    assert find_stragglers(scores, replace(MONITOR, step_s=0.36)) == ()
    for world in (3, 4):
        times = noisy_job(world=world, steps=60, step_s=0.3, jitter_s=0.1, late={},
                          seed=seed)
        assert find_stragglers(straggler_scores(times, min_spread_s=0.05), MONITOR) == ()


def test_healthy_noisy_job_would_have_been_flagged_without_the_step_and_noise_terms() -> None:
    times = noisy_job(world=2, steps=60, step_s=0.3, jitter_s=0.05, late={0: 0.07}, seed=1)
    scores = straggler_scores(times, min_spread_s=MONITOR.min_spread_s)
    old = replace(MONITOR, min_step_fraction=0.0, noise_ratio=0.0)
    assert find_stragglers(scores, old) == (0,)
    assert find_stragglers(scores, MONITOR) == ()


@pytest.mark.parametrize("world,slow", [(2, 1), (4, 2)])
def test_a_slow_rank_in_a_noisy_job_is_still_found(world: int, slow: int) -> None:
    # Three times the work of its peers (the user-script straggler): 0.2 s late per step.
    times = noisy_job(world=world, steps=40, step_s=0.1, jitter_s=0.03, late={slow: 0.2},
                      seed=3)
    assert find_stragglers(straggler_scores(times, min_spread_s=0.05), MONITOR) == (slow,)
    assert find_stragglers(straggler_scores(times, min_spread_s=0.05),
                           replace(MONITOR, step_s=0.33)) == (slow,)


def test_a_lag_that_swings_more_than_it_averages_is_jitter() -> None:
    rnd = random.Random(7)
    times = {0: {("0", s): s * 1.0 for s in range(1, 41)},
             1: {("0", s): s * 1.0 + 0.3 + rnd.uniform(-0.29, 0.29) for s in range(1, 41)}}
    scores = straggler_scores(times)
    assert scores[1].noise_s > 0.1
    assert find_stragglers(scores) == ()
    assert find_stragglers(scores, StragglerPolicy(noise_ratio=0.0, min_step_fraction=0)) == (1,)


def test_no_straggler_in_a_healthy_job() -> None:
    assert find_stragglers(straggler_scores(enter_times({}))) == ()


def test_lateness_below_noise_is_not_a_straggler() -> None:
    noisy = {r: {("0", s): s + ((s * 7 + r * 13) % 10) * 0.01 for s in range(1, 30)}
             for r in range(4)}
    noisy[1] = {k: v + 0.02 for k, v in noisy[1].items()}  # late, but within the noise
    assert find_stragglers(straggler_scores(noisy), StragglerPolicy()) == ()


def test_too_few_samples() -> None:
    assert find_stragglers(straggler_scores(enter_times({1: 1.0}, n=3))) == ()


@given(st.lists(st.floats(min_value=0, max_value=1e4), max_size=50),
       st.floats(min_value=0, max_value=1e5), st.floats(min_value=0, max_value=1e5))
def test_threshold_never_below_floor_and_evaluate_never_raises(
        times: list[float], now: float, changed: float) -> None:
    assert stall_threshold(POLICY, times) >= POLICY.floor_s
    rs = [RankProgress(rank=0, step=1, step_changed_s=changed, heartbeat_s=None)]
    d = evaluate_stall(POLICY, now_s=now, started_s=0.0, ranks=rs, step_times=times)
    assert d.stalled == (d.idle_s > d.threshold_s)
