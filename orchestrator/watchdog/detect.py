"""Hang-detection policies: when is a job stalled, which ranks are dead or silent, who straggles.

Pure module. Policies return decisions; the controller acts on them. Nothing here raises on
odd input: an empty history gives the floor threshold, a missing heartbeat is "silent".

Stall rule: stalled when no rank's step advanced for max(floor, k × p95 step time);
before the first step the longer `first_step_timeout_s` applies (model build, compile, data),
and while a rank saves or loads a checkpoint `checkpoint_timeout_s` does (the time since it
began counts, not the time since the last step).
Straggler rule: step times even out under all-reduce (everyone waits for the slowest), so a
straggler is found by TIME-TO-ENTER each collective: the rank that is persistently the last to
enqueue, by a margin, is the one making the others wait. The margin is relative three ways:
to the step time (a rank 50 ms late in a 500 ms step costs the job 10 %, which a loaded host
shows on healthy jobs; the default asks for 30 % of the step), to the spread of its
peers' enter times, and to the noise of its own lateness (a lag that swings by more than it
averages is jitter, not a slow rank). The step time is the job's median step when the caller
knows it, else the rank's own interval between collectives. A straggler is a warning: the job
runs, only slower.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StallPolicy:
    """Defaults aim at a verdict within 30 s of a stall on a job with sub-second steps."""

    floor_s: float = 12.0
    k: float = 5.0
    first_step_timeout_s: float = 300.0
    checkpoint_timeout_s: float = 300.0
    heartbeat_timeout_s: float = 15.0
    window: int = 200  # step times kept for the p95

    @staticmethod
    def fixed(stall_timeout_s: float, first_step_timeout_s: float | None = None,
              heartbeat_timeout_s: float | None = None,
              checkpoint_timeout_s: float | None = None) -> StallPolicy:
        """A spec that sets `watchdog.stall_timeout_s` turns the adaptive part off (k=0).
        The first step and a checkpoint default to 10 × the stall threshold."""
        first = first_step_timeout_s or 10 * stall_timeout_s
        return StallPolicy(floor_s=stall_timeout_s, k=0.0, first_step_timeout_s=first,
                           checkpoint_timeout_s=checkpoint_timeout_s or first,
                           heartbeat_timeout_s=heartbeat_timeout_s or stall_timeout_s)


@dataclass(frozen=True)
class RankProgress:
    """What the controller knows of one rank. Times are seconds on one monotonic clock."""

    rank: int
    step: int | None  # None before the first completed step
    step_changed_s: float | None  # when `step` last advanced
    heartbeat_s: float | None  # last heartbeat received
    alive: bool = True  # False once the process is known to have exited
    checkpoint_s: float | None = None  # since when it saves or loads a checkpoint, if it does
    checkpoint_done_s: float | None = None  # when it last finished one (progress, like a step)
    done: bool = False  # it finished training (its last heartbeat said so)


@dataclass(frozen=True)
class StallDecision:
    stalled: bool
    reason: str  # "" | "stall" | "first_step" | "checkpoint"
    idle_s: float
    threshold_s: float
    dead_ranks: tuple[int, ...] = ()
    silent_ranks: tuple[int, ...] = ()  # alive, but no heartbeat for heartbeat_timeout_s

    @property
    def needs_diagnosis(self) -> bool:
        return self.stalled or bool(self.dead_ranks) or bool(self.silent_ranks)


def p95(values: Sequence[float]) -> float | None:
    """Nearest-rank 95th percentile; None when empty. p95([1..100]) == 95."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v) and v >= 0)
    if not vals:
        return None
    idx = max(0, math.ceil(0.95 * len(vals)) - 1)
    return vals[idx]


def stall_threshold(policy: StallPolicy, step_times: Sequence[float]) -> float:
    """max(floor, k × p95(recent step times)); the floor alone without history."""
    q = p95(list(step_times)[-policy.window:])
    return policy.floor_s if q is None else max(policy.floor_s, policy.k * q)


def evaluate_stall(policy: StallPolicy, *, now_s: float, started_s: float,
                   ranks: Sequence[RankProgress], step_times: Sequence[float]) -> StallDecision:
    """Decide whether the job is stalled now. Example: floor 12 s, p95 1 s, k 5 → threshold
    12 s; a job whose newest step change was 13 s ago is stalled ("stall"). Had a rank begun
    a checkpoint save 5 s ago, it would be held to `checkpoint_timeout_s` from then. Ranks that
    all finished training are never stalled, and a finished rank is never silent."""
    dead = tuple(sorted(r.rank for r in ranks if not r.alive))
    silent = tuple(sorted(
        r.rank for r in ranks
        if r.alive and not r.done
        and now_s - (r.heartbeat_s if r.heartbeat_s is not None else started_s)
        > policy.heartbeat_timeout_s))
    changes = [r.step_changed_s for r in ranks if r.step is not None and r.step_changed_s]
    saving = [r.checkpoint_s for r in ranks if r.alive and r.checkpoint_s is not None]
    if not changes:
        since, thr, reason = started_s, policy.first_step_timeout_s, "first_step"
    else:
        since, thr, reason = max(changes), stall_threshold(policy, step_times), "stall"
    saved = [r.checkpoint_done_s for r in ranks if r.checkpoint_done_s is not None]
    since = max([since, *saved, *saving])
    if saving and policy.checkpoint_timeout_s > thr:
        thr, reason = policy.checkpoint_timeout_s, "checkpoint"
    idle = max(0.0, now_s - since)
    # Every rank finished: the job is ending (its results are on their way), not stalled.
    stalled = idle > thr and not (ranks and all(r.done for r in ranks))
    return StallDecision(stalled=stalled, reason=reason if stalled else "", idle_s=idle,
                         threshold_s=thr, dead_ranks=dead, silent_ranks=silent)


@dataclass(frozen=True)
class StragglerPolicy:
    min_samples: int = 5  # collectives seen by the rank and at least one other
    min_late_fraction: float = 0.6  # share of collectives where the rank entered last
    min_lateness_s: float = 0.02  # median lateness must exceed this ...
    min_ratio: float = 3.0  # ... and this many times the others' typical |lateness|
    # Only collectives whose enter times spread at least this much count: a collective every
    # rank entered within the noise says nothing about who makes the others wait (a loss
    # all-reduce right after a gradient all-reduce has synchronised everyone).
    min_spread_s: float = 0.0
    # The median lateness must also reach this share of the step time ...
    min_step_fraction: float = 0.3
    # ... and this many times the noise of the rank's own lateness (its median absolute
    # deviation: how much the lag swings from collective to collective).
    noise_ratio: float = 3.0
    # The job's step time (seconds) when known; else each rank's interval between collectives.
    step_s: float | None = None


@dataclass(frozen=True)
class StragglerScore:
    rank: int
    samples: int
    late_fraction: float  # share of collectives where this rank entered last
    median_lateness_s: float  # median of (my enter time - median of the others' enter times)
    others_spread_s: float  # median spread (max - min) of the OTHER ranks' enter times: noise
    noise_s: float = 0.0  # median absolute deviation of this rank's lateness
    cadence_s: float = 0.0  # median interval between this rank's consecutive collectives


def straggler_scores(enter_times: Mapping[int, Mapping[Any, float]], *,
                     min_spread_s: float = 0.0) -> tuple[StragglerScore, ...]:
    """Score every rank from time-to-enter. `enter_times[rank][(pg, seq)] = seconds`;
    collectives whose enter times spread less than `min_spread_s` are skipped."""
    keys: dict[Hashable, dict[int, float]] = {}
    for rank, times in enter_times.items():
        for key, t in times.items():
            keys.setdefault(key, {})[rank] = t
    late: dict[int, list[float]] = {r: [] for r in enter_times}
    spread: dict[int, list[float]] = {r: [] for r in enter_times}
    last: dict[int, int] = dict.fromkeys(enter_times, 0)
    for at in keys.values():
        if len(at) < 2 or max(at.values()) - min(at.values()) < min_spread_s:
            continue
        last[max(at, key=lambda r: at[r])] += 1
        for r, t in at.items():
            others = [v for q, v in at.items() if q != r]
            late[r].append(t - statistics.median(others))
            spread[r].append(max(others) - min(others))
    out = []
    for r in sorted(enter_times):
        n = len(late[r])
        med = statistics.median(late[r]) if n else 0.0
        out.append(StragglerScore(
            rank=r, samples=n, late_fraction=(last[r] / n) if n else 0.0,
            median_lateness_s=med,
            others_spread_s=statistics.median(spread[r]) if n else 0.0,
            noise_s=statistics.median(abs(x - med) for x in late[r]) if n else 0.0,
            cadence_s=_cadence(enter_times[r])))
    return tuple(out)


def _cadence(times: Mapping[Any, float]) -> float:
    """Median interval between consecutive collectives (seq s and s+1 of one group)."""
    gaps = [t - times[prev] for key, t in times.items()
            if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int)
            and (prev := (key[0], key[1] - 1)) in times and t >= times[prev]]
    return statistics.median(gaps) if gaps else 0.0


def find_stragglers(scores: Sequence[StragglerScore],
                    policy: StragglerPolicy = StragglerPolicy()) -> tuple[int, ...]:
    """Ranks that are persistently the last to enter, by a margin well above the noise and
    a real share of the step time.

    Example: rank 2 enters every all_reduce of a 1 s step 0.3 s after ranks 0, 1, 3, which
    enter within 5 ms of each other: late_fraction 1.0, lateness 0.3 s >= max(0.02,
    3 x 0.005, 0.3 x 1 s, 3 x its own jitter) -> (2,). Had it been 0.1 s late, that is a
    tenth of the step: no straggler.
    """
    out = []
    for s in scores:
        if s.samples < policy.min_samples or s.late_fraction < policy.min_late_fraction:
            continue
        step = policy.step_s if policy.step_s else s.cadence_s
        need = max(policy.min_lateness_s, policy.min_ratio * s.others_spread_s,
                   policy.noise_ratio * s.noise_s, policy.min_step_fraction * step)
        if s.median_lateness_s > 0 and s.median_lateness_s >= need:
            out.append(s.rank)
    return tuple(out)
