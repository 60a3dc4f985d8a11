"""The controller's hang monitor: what to diagnose, when, and what to do about it. Pure module.

The controller feeds it what it already drains from the workers every tick (metrics rows with
`step_time_s`, per-rank heartbeats) and asks three questions:

* `due(now_s)` -> a `Due` (trigger "stall", with the StallDecision) once per stall episode:
  no rank's completed step advanced for max(floor, k x p95 step time) (first-step threshold
  before the first step), or a rank's heartbeats stopped. A new episode starts only after
  progress resumes, so an observed hang is reported once, not every tick. A user's job that
  reports no step progresses by its collectives instead: the count of collectives the
  probe in each rank saw enqueued; the threshold is then max(floor, k x p95 of the gaps
  between observed advances), and the first-step threshold covers the first collective.
* `probe_due(now_s)` -> True every `probe_interval_s` of healthy progress: the controller then
  collects Flight Recorder entries from every rank and `analysis()` scores time-to-enter
  (trigger "straggler") -- step times even out under all-reduce, enter times do not. A rank
  is reported (`keep_straggler`) once `straggler_confirm` probes in a row named it: one
  window of lateness on a loaded host is noise, a lag that persists is a straggler.
* `decide(report)` -> the `Action` for a report under the spec's `watchdog.action`.

It never touches Ray or the workers: the attempt's watchdog in the controller
(orchestrator/runtime/hangwatch.py) acts.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.lifecycle import Reason
from orchestrator.spec import Watchdog, WatchdogAction
from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.culprits import hardware_culprits, suspect_nodes
from orchestrator.watchdog.detect import (
    RankProgress,
    StallDecision,
    StallPolicy,
    StragglerPolicy,
    evaluate_stall,
)
from orchestrator.watchdog.inputs import analysis_input
from orchestrator.watchdog.report import DiagnosisReport, RankLocation, Verdict


@dataclass(frozen=True)
class Due:
    trigger: str  # "stall" | "silent"
    decision: StallDecision
    progress: str = "step"  # "step" | "collective": what the stall rule watched

    def describe(self) -> str:
        d = self.decision
        if d.stalled and d.reason == "checkpoint":
            return (f"a checkpoint save or load ran for {d.idle_s:.1f} s "
                    f"(threshold {d.threshold_s:.1f} s)")
        if d.stalled:
            first = d.reason == "first_step"
            what = (("first step" if first else "step") if self.progress == "step"
                    else "first collective" if first else "collectives")
            verb = "came" if first and self.progress != "step" else "advanced"
            return (f"no rank's {what} {verb} for {d.idle_s:.1f} s "
                    f"(threshold {d.threshold_s:.1f} s)")
        return f"no heartbeat from rank(s) {list(d.silent_ranks)}"


@dataclass(frozen=True)
class Action:
    """What the controller does with a report: "observe" (record only), "restart" (end the
    attempt as a failure, the control plane restarts from the checkpoint) or "fail" (end the
    job with HANG_DETECTED). `avoid_nodes` are placed nowhere in the next attempt."""

    kind: WatchdogAction
    reason: Reason = Reason.HANG_DETECTED
    message: str = ""
    avoid_nodes: tuple[str, ...] = ()


@dataclass
class _Rank:
    step: int | None = None
    step_changed_s: float | None = None
    heartbeat: Any = None
    heartbeat_s: float | None = None
    collectives: int | None = None
    collectives_changed_s: float | None = None
    checkpoint_s: float | None = None  # first seen in the checkpoint phase (still in it)
    checkpoint_done_s: float | None = None  # last seen leaving it
    done: bool = False  # its heartbeat's phase is DONE_PHASE


# The phases a rank's heartbeat names while it saves or loads a checkpoint, and once it has
# finished training (workers' Phase).
CHECKPOINT_PHASE = "checkpoint"
DONE_PHASE = "done"


@dataclass
class HangMonitor:
    """State of one attempt. Times are the controller's monotonic seconds."""

    world_size: int
    started_s: float
    policy: StallPolicy = field(default_factory=StallPolicy)
    action: WatchdogAction = WatchdogAction.OBSERVE
    probe_interval_s: float = 5.0
    # Stricter than the analyzer's default: a straggler report on a healthy job is noise.
    straggler: StragglerPolicy = field(default_factory=lambda: StragglerPolicy(
        min_samples=8, min_late_fraction=0.75, min_lateness_s=0.05, min_ratio=3.0,
        min_spread_s=0.05))
    _ranks: dict[int, _Rank] = field(default_factory=dict)
    _step_times: list[float] = field(default_factory=list)
    _collective_gaps: list[float] = field(default_factory=list)
    _reported_episode: bool = False
    _last_probe_s: float | None = None
    _probe_steps: int = 0
    straggler_confirm: int = 2  # consecutive probes that must name the same ranks
    _straggler_reported: set[tuple[int, ...]] = field(default_factory=set)
    _straggler_streak: tuple[tuple[int, ...], int] = ((), 0)

    @classmethod
    def from_spec(cls, watchdog: Watchdog, *, world_size: int, now_s: float,
                  probe_interval_s: float = 5.0) -> HangMonitor:
        """The job spec's `watchdog` block picks the policy: a fixed `stall_timeout_s` turns
        the adaptive part off."""
        stall, first = watchdog.stall_timeout_s, watchdog.first_step_timeout_s
        if stall:
            # Heartbeats come every second but a loaded host delays them by seconds: a silent
            # rank is one quiet for the stall threshold and at least 15 s.
            policy = StallPolicy.fixed(float(stall), float(first) if first else None,
                                       heartbeat_timeout_s=max(float(stall), 15.0),
                                       checkpoint_timeout_s=watchdog.checkpoint_timeout_s)
        else:
            first_s = float(first) if first else StallPolicy.first_step_timeout_s
            policy = StallPolicy(first_step_timeout_s=first_s,
                                 checkpoint_timeout_s=watchdog.checkpoint_timeout_s or first_s)
        return cls(world_size=world_size, started_s=now_s, policy=policy,
                   action=watchdog.action, probe_interval_s=probe_interval_s)

    # -- inputs -----------------------------------------------------------------------------
    def observe(self, *, now_s: float, metrics: Sequence[Mapping[str, Any]] = (),
                ranks: Mapping[int, Mapping[str, Any]] | None = None,
                collectives: Mapping[int, int] | None = None) -> None:
        """One tick's drain: metrics rows (rank, step, step_time_s), per-rank updates
        (`last_heartbeat`: the worker's own timestamp; a new value is a new heartbeat;
        `step`: the step the rank is running, so the one before it is complete, unless it is
        `start_step`, the checkpoint's step a resumed rank started from) and per-rank
        collective counts (user code). Metrics rows arrive in batches at the loop's sync steps
        (workers/loop/stepsync.py); the heartbeat's step shows progress in between."""
        for row in metrics:
            r, step = row.get("rank"), row.get("step")
            if r is None or step is None:
                continue
            self._advance(int(r), int(step), now_s)
            t = row.get("step_time_s")
            if isinstance(t, int | float) and t >= 0:
                self._step_times.append(float(t))
        del self._step_times[:-self.policy.window]
        for r, upd in (ranks or {}).items():
            hb = upd.get("last_heartbeat")
            st = self._ranks.setdefault(int(r), _Rank())
            if hb is not None and hb != st.heartbeat:
                st.heartbeat, st.heartbeat_s = hb, now_s
            running, start = upd.get("step"), upd.get("start_step") or 0
            if hb is not None and isinstance(running, int) and running - 1 > int(start):
                self._advance(int(r), running - 1, now_s)
            if hb is not None and "phase" in upd:
                self._phase(st, upd.get("phase"), now_s)
        for r, count in (collectives or {}).items():
            st = self._ranks.setdefault(int(r), _Rank())
            if st.collectives is None or count > st.collectives:
                if st.collectives_changed_s is not None:
                    self._collective_gaps.append(now_s - st.collectives_changed_s)
                st.collectives, st.collectives_changed_s = int(count), now_s
                if self.progress == "collective":
                    self._reported_episode = False
                    self._probe_steps += 1
        del self._collective_gaps[:-self.policy.window]

    def _phase(self, st: _Rank, phase: Any, now_s: float) -> None:
        """A save or load runs from the first heartbeat that shows it; leaving it is progress
        (a new stall after it is a new episode)."""
        st.done = phase == DONE_PHASE
        if phase == CHECKPOINT_PHASE:
            if st.checkpoint_s is None:
                st.checkpoint_s = now_s
        elif st.checkpoint_s is not None:
            st.checkpoint_s, st.checkpoint_done_s = None, now_s
            self._reported_episode = False

    def _advance(self, rank: int, completed: int, now_s: float) -> None:
        st = self._ranks.setdefault(rank, _Rank())
        if st.step is None or completed > st.step:
            # every step counts towards the next straggler probe, also those made between
            # two polls (a loaded controller polls less often than the ranks step)
            self._probe_steps += 1 if st.step is None else completed - st.step
            st.step, st.step_changed_s = completed, now_s
            self._reported_episode = False  # progress: a new stall is a new episode

    @property
    def progress(self) -> str:
        """"step" once any rank reported a step, else "collective" once any rank's probe
        saw one, else "step" (nothing yet: the first-step threshold runs)."""
        if any(st.step is not None for st in self._ranks.values()):
            return "step"
        if any(st.collectives is not None for st in self._ranks.values()):
            return "collective"
        return "step"

    def has_progress(self) -> bool:
        """Some rank completed a step or enqueued a collective."""
        return any(st.step is not None or st.collectives is not None
                   for st in self._ranks.values())

    # -- decisions --------------------------------------------------------------------------
    def evaluate(self, now_s: float, *, dead: Sequence[int] = ()) -> StallDecision:
        by_step = self.progress == "step"
        progress = [RankProgress(rank=r, step=st.step if by_step else st.collectives,
                                 step_changed_s=st.step_changed_s if by_step
                                 else st.collectives_changed_s,
                                 heartbeat_s=st.heartbeat_s, alive=r not in dead,
                                 checkpoint_s=st.checkpoint_s,
                                 checkpoint_done_s=st.checkpoint_done_s, done=st.done)
                    for r in range(self.world_size)
                    for st in [self._ranks.get(r, _Rank())]]
        return evaluate_stall(self.policy, now_s=now_s, started_s=self.started_s,
                              ranks=progress,
                              step_times=self._step_times if by_step else self._collective_gaps)

    def due(self, now_s: float) -> Due | None:
        """A stall (or silent ranks) not yet reported in this episode."""
        if self._reported_episode:
            return None
        d = self.evaluate(now_s)
        # A rank that never sent a heartbeat is still starting (imports, model build): the
        # first-step threshold covers it, not the silence rule.
        silent = tuple(r for r in d.silent_ranks
                       if self._ranks.get(r, _Rank()).heartbeat_s is not None)
        d = replace(d, silent_ranks=silent)
        if d.stalled:
            return Due("stall", d, progress=self.progress)
        if d.silent_ranks:
            return Due("silent", d, progress=self.progress)
        return None

    def mark_reported(self) -> None:
        self._reported_episode = True

    @property
    def reported(self) -> bool:
        return self._reported_episode

    def probe_due(self, now_s: float) -> bool:
        """Time for a straggler probe: enough new steps since the last one, and no stall."""
        if self._reported_episode or self.probe_interval_s <= 0:
            return False
        if self._last_probe_s is None:
            self._last_probe_s = now_s
            return False
        if now_s - self._last_probe_s < self.probe_interval_s:
            return False
        if self._probe_steps < self.straggler.min_samples * max(1, self.world_size):
            return False
        self._last_probe_s, self._probe_steps = now_s, 0
        return True

    def keep_straggler(self, report: DiagnosisReport) -> bool:
        """Feed one probe's report: True (store it) when `straggler_confirm` probes in a row
        named the same slow ranks, once per set of ranks (the probe repeats)."""
        if report.verdict is not Verdict.STRAGGLER or not report.culprit_ranks:
            self._straggler_streak = ((), 0)
            return False
        key = tuple(report.culprit_ranks)
        seen, count = self._straggler_streak
        count = count + 1 if seen == key else 1
        self._straggler_streak = (key, count)
        if count < self.straggler_confirm or key in self._straggler_reported:
            return False
        self._straggler_reported.add(key)
        return True

    def median_step_s(self) -> float | None:
        return statistics.median(self._step_times) if self._step_times else None

    # -- analysis ---------------------------------------------------------------------------
    def analysis(self, *, summaries: Mapping[int, Mapping[str, Any]],
                 dead: Mapping[int, str] | None = None,
                 exit_times: Mapping[int, float] | None = None,
                 announcements: Mapping[int, Mapping[str, Any]] | None = None,
                 locations: Mapping[int, RankLocation] | None = None, trigger: str = "stall",
                 artifacts: tuple[str, ...] = (), context: str = "") -> DiagnosisReport:
        """analysis_input -> analyze -> report with the detection context in `details`."""
        inp = analysis_input(summaries, world_size=self.world_size, dead=dead,
                             exit_times=exit_times, announcements=announcements,
                             locations=locations, trigger=trigger, artifacts=artifacts)
        policy = self.straggler
        med = self.median_step_s()
        if med is not None:
            # Lateness must matter against the job's step time (else each rank's interval
            # between collectives stands in for it).
            policy = replace(policy, step_s=med)
        report = analyze(inp, straggler_policy=policy)
        if not context:
            return report
        d = report.to_dict()
        d["details"] = {**d.get("details", {}), "detection": context}
        return DiagnosisReport.from_dict(d)

    def decide(self, report: DiagnosisReport, *,
               rank_nodes: Mapping[int, str | None] | None = None) -> Action:
        """Observe records; restart / fail end the attempt. A straggler is never a hang."""
        if report.verdict is Verdict.STRAGGLER or self.action == WatchdogAction.OBSERVE:
            return Action(WatchdogAction.OBSERVE, message=report.summary)
        avoid: tuple[str, ...] = ()
        if self.action == WatchdogAction.RESTART:
            named = {n for n, _ in hardware_culprits(report)}
            if report.verdict is Verdict.COMM_WEDGED:
                named.update(suspect_nodes(report, rank_nodes or {}))
            avoid = tuple(sorted(named))
        return Action(self.action, message=report.summary, avoid_nodes=avoid)
