"""The controller's hang monitor (pure): when a diagnosis is due, probes, and actions."""

from __future__ import annotations

from orchestrator.spec import Watchdog
from orchestrator.watchdog.monitor import (
    CHECKPOINT_PHASE,
    DONE_PHASE,
    HangMonitor,
    suspect_nodes,
)
from orchestrator.watchdog.report import (
    DiagnosisReport,
    RankReport,
    SuspectHardware,
    Verdict,
)


def _mon(**watchdog: object) -> HangMonitor:
    return HangMonitor.from_spec(Watchdog(**watchdog), world_size=2, now_s=0.0,
                                 probe_interval_s=5.0)


def _steps(m: HangMonitor, now: float, step: int, *, dt: float = 0.1) -> None:
    m.observe(now_s=now, metrics=[{"rank": r, "step": step, "step_time_s": dt}
                                  for r in range(2)],
              ranks={r: {"last_heartbeat": now} for r in range(2)})


def _report(verdict: Verdict, culprits: tuple[int, ...] = (1,), **kw: object
            ) -> DiagnosisReport:
    return DiagnosisReport(verdict=verdict, culprit_ranks=culprits, confidence=0.9,
                           summary="s", **kw)  # type: ignore[arg-type]


def test_fixed_threshold_from_the_spec_and_one_report_per_episode() -> None:
    m = _mon(stall_timeout_s=3, action="fail")
    assert (m.policy.floor_s, m.policy.k, m.policy.first_step_timeout_s) == (3.0, 0.0, 30.0)
    assert m.policy.heartbeat_timeout_s == 15.0
    _steps(m, 1.0, 1)
    _steps(m, 2.0, 2)
    assert m.due(4.5) is None
    due = m.due(5.5)
    assert due is not None and due.trigger == "stall" and due.decision.reason == "stall"
    assert "no rank's step advanced for 3.5 s" in due.describe()
    m.mark_reported()
    assert m.due(20.0) is None  # still the same stall: reported once
    _steps(m, 21.0, 3)  # progress resumed: a new episode
    assert not m.reported
    assert m.due(21.5) is None and m.due(24.5) is not None


def test_adaptive_defaults_follow_the_step_time() -> None:
    m = _mon()
    assert m.policy.floor_s == 12.0 and m.policy.k == 5.0
    for i in range(1, 20):
        _steps(m, float(i) * 4, i, dt=4.0)  # 4 s steps: threshold 5 x 4 = 20 s
    last = 19 * 4.0
    assert m.due(last + 15) is None
    assert m.due(last + 21) is not None


def test_first_step_threshold_before_any_step() -> None:
    m = _mon(stall_timeout_s=2, first_step_timeout_s=50)
    assert m.due(40.0) is None
    due = m.due(51.0)
    assert due is not None and due.decision.reason == "first_step"
    assert "first step" in due.describe()


def test_a_resumed_rank_is_on_its_first_step_until_it_completes_one() -> None:
    """Ranks resumed from a step-2 checkpoint run step 3 first: that shows no step completed
    by this attempt, so the first-step threshold covers the warm-up, not the stall one."""
    m = _mon(stall_timeout_s=2, first_step_timeout_s=50)
    resumed = {r: {"last_heartbeat": 1.0, "step": 3, "start_step": 2} for r in range(2)}
    m.observe(now_s=1.0, ranks=resumed)
    assert m.due(10.0) is None
    due = m.due(51.0)
    assert due is not None and due.decision.reason == "first_step"
    m = _mon(stall_timeout_s=2, first_step_timeout_s=50)
    m.observe(now_s=1.0, ranks=resumed)
    m.observe(now_s=5.0, ranks={r: {"last_heartbeat": 5.0, "step": 4, "start_step": 2}
                                for r in range(2)})  # step 3 is done: the stall rule runs
    assert m.due(6.0) is None
    due = m.due(7.5)
    assert due is not None and due.decision.reason == "stall"
    # The same heartbeat from a fresh start (no start_step) shows step 2 completed.
    m = _mon(stall_timeout_s=2, first_step_timeout_s=50)
    m.observe(now_s=1.0, ranks={r: {"last_heartbeat": 1.0, "step": 3} for r in range(2)})
    due = m.due(3.5)
    assert due is not None and due.decision.reason == "stall"


def test_a_long_checkpoint_save_is_not_a_stall_and_its_end_restarts_the_clock() -> None:
    from workers.loop.callbacks import Phase

    # The phases the loop's heartbeat names.
    assert (Phase.CHECKPOINT.value, Phase.DONE.value) == (CHECKPOINT_PHASE, DONE_PHASE)
    m = _mon(stall_timeout_s=2, first_step_timeout_s=50, checkpoint_timeout_s=100)
    assert m.policy.checkpoint_timeout_s == 100.0

    def beat(now: float, step: int, phase: str) -> None:
        m.observe(now_s=now, ranks={r: {"last_heartbeat": now, "step": step, "phase": phase}
                                    for r in range(2)})

    _steps(m, 1.0, 1)
    beat(1.5, 2, "forward")
    _steps(m, 2.0, 2)
    beat(2.5, 2, "checkpoint")  # saving after step 2
    for now in (30.0, 60.0, 89.0):  # the heartbeat thread beats on through the save
        beat(now, 2, "checkpoint")
    assert m.due(90.0) is None  # 87.5 s into the save: under 100 s
    beat(102.0, 2, "checkpoint")
    due = m.due(103.0)
    assert due is not None and due.decision.reason == "checkpoint"
    assert due.describe() == "a checkpoint save or load ran for 100.5 s (threshold 100.0 s)"
    m.mark_reported()  # action observe: the job runs on
    beat(110.0, 3, "forward")  # the save ended (seen at 110): step 3 runs
    assert m.due(111.5) is None
    due = m.due(112.5)  # 2.5 s after the save, step 3 is not done: a stall
    assert due is not None and due.decision.reason == "stall"
    beat(113.0, 4, "done")  # finished: the results are on their way
    assert m.due(200.0) is None
    # Adaptive defaults: a save has the first-step threshold unless the spec says otherwise.
    assert _mon().policy.checkpoint_timeout_s == 300.0
    assert _mon(first_step_timeout_s=40).policy.checkpoint_timeout_s == 40.0
    assert _mon(stall_timeout_s=3).policy.checkpoint_timeout_s == 30.0


def test_silent_only_after_a_first_heartbeat() -> None:
    m = _mon(stall_timeout_s=100)
    assert m.due(60.0) is None  # ranks still starting: no heartbeat yet, not "silent"
    m.observe(now_s=60.0, ranks={0: {"last_heartbeat": 1.0}, 1: {"last_heartbeat": 1.0}})
    m.observe(now_s=150.0, ranks={0: {"last_heartbeat": 2.0}})  # rank 1 stops
    assert m.due(150.0) is None  # quiet for 90 s < max(100, 15) s
    due = m.due(170.0)
    assert due is not None and due.trigger == "silent"
    assert due.decision.silent_ranks == (1,)


def test_probe_needs_time_and_steps_and_no_stall() -> None:
    m = _mon(stall_timeout_s=100)
    assert not m.probe_due(0.0)  # starts the clock
    for i in range(1, 12):
        _steps(m, 0.5 * i, i)
    assert not m.probe_due(4.0)
    assert m.probe_due(6.0)
    assert not m.probe_due(12.0)  # no new steps since
    for i in range(12, 24):
        _steps(m, 12 + 0.1 * i, i)
    assert m.probe_due(20.0)
    m.mark_reported()
    assert not m.probe_due(40.0)


def test_probe_counts_the_steps_made_between_two_polls() -> None:
    """A loaded controller polls less often than the ranks step: 9 steps seen in 3 polls
    count as 9 per rank (the probe needs 8 x 2 ranks), as if every step had been seen."""
    m = _mon(stall_timeout_s=100)
    assert not m.probe_due(0.0)
    for i in (1, 5, 9):
        _steps(m, float(i) / 3, i)
    assert m.probe_due(6.0)


def test_actions() -> None:
    straggler = _report(Verdict.STRAGGLER)
    hang = _report(Verdict.NOT_JOINED)
    assert _mon(action="fail").decide(straggler).kind == "observe"
    assert _mon(action="observe").decide(hang).kind == "observe"
    act = _mon(action="fail").decide(hang)
    assert (act.kind, act.reason, act.avoid_nodes) == ("fail", "HANG_DETECTED", ())
    assert _mon(action="restart").decide(hang).kind == "restart"


def test_restart_avoids_the_suspect_node_only_for_wedged_with_hardware_evidence() -> None:
    nodes = {0: "a", 1: "a", 2: "b", 3: "b"}
    err = (RankReport(rank=2, state="waiting", nccl_errors=("NET/IB: completion error",)),)
    wedged = _report(Verdict.COMM_WEDGED, (2, 3), evidence=err, suspect_hardware=(
        SuspectHardware(level="node", name="b", ranks=(2, 3), reason="shared"),))
    assert _mon(action="restart").decide(wedged, rank_nodes=nodes).avoid_nodes == ("b",)
    topology_only = _report(Verdict.COMM_WEDGED, (2, 3), suspect_hardware=(
        SuspectHardware(level="node", name="b", ranks=(2, 3), reason="shared"),))
    assert suspect_nodes(topology_only, nodes) == ()  # a suspicion, not evidence
    gpu = _report(Verdict.COMM_WEDGED, (2,), evidence=err, suspect_hardware=(
        SuspectHardware(level="gpu", name="b/GPU0", ranks=(2,), reason="x"),))
    assert suspect_nodes(gpu, nodes) == ("b",)
    switch = _report(Verdict.COMM_WEDGED, (0, 2), evidence=err, suspect_hardware=(
        SuspectHardware(level="leaf", name="l0", ranks=(0, 1, 2, 3), reason="x"),))
    assert suspect_nodes(switch, nodes) == ()
    errors = _report(Verdict.COMM_WEDGED, (1,), evidence=(
        RankReport(rank=1, state="waiting", nccl_errors=("ib completion error",)),))
    assert suspect_nodes(errors, nodes) == ("a",)
    no_evidence = _report(Verdict.COMM_WEDGED, (0, 1, 2, 3))
    assert _mon(action="restart").decide(no_evidence, rank_nodes=nodes).avoid_nodes == ()
    hang = _report(Verdict.NOT_JOINED, (2,), suspect_hardware=wedged.suspect_hardware)
    assert _mon(action="restart").decide(hang, rank_nodes=nodes).avoid_nodes == ()


def test_straggler_reported_once_per_culprit_set_after_two_probes_in_a_row() -> None:
    m = _mon()
    rep = _report(Verdict.STRAGGLER, (1,))
    assert [m.keep_straggler(rep) for _ in range(4)] == [False, True, False, False]
    assert not m.keep_straggler(_report(Verdict.NOT_JOINED))


def test_a_straggler_named_by_probes_that_are_not_consecutive_is_never_reported() -> None:
    m = _mon()
    one, two = _report(Verdict.STRAGGLER, (1,)), _report(Verdict.STRAGGLER, (0,))
    quiet = _report(Verdict.NON_COLLECTIVE_HANG, ())
    assert [m.keep_straggler(r) for r in (one, quiet, one, two, one, quiet)] == [False] * 6


def test_announced_op_ids_become_collective_seqs() -> None:
    from orchestrator.watchdog.inputs import resolve_announcements, seq_for_op

    # op ids 1 2 [3 = a recv, not recorded] 4 5 -> collective seqs 1 2 3 4
    index = [(1, 1), (2, 2), (4, 3), (5, 4)]
    assert [seq_for_op(index, o) for o in (2, 4, 6)] == [2, 3, 5]
    assert seq_for_op([], 7) == 7  # nothing recorded: no p2p to skip
    entries = [{"process_group": ["0", "default_pg"], "op_id": o, "collective_seq_id": s,
                "is_p2p": False} for o, s in index]
    live = {"rank": 0, "fr_dump": {"entries": entries},
            "pending": [{"op": "all_reduce", "op_id": 6, "seq": None, "source": "announce"}]}
    sums, anns = resolve_announcements({0: live}, {1: {"op": "all_reduce", "op_id": 6,
                                                       "seq": None, "source": "announce"}})
    assert sums[0]["pending"][0]["seq"] == 5 and anns[1]["seq"] == 5
    assert live["pending"][0]["seq"] is None  # inputs are not modified


def test_heartbeat_steps_are_progress_between_batched_metrics_rows() -> None:
    m = _mon(stall_timeout_s=3, action="fail")
    _steps(m, 1.0, 1)
    # No metrics rows for a while (the loop syncs every few steps), but every heartbeat
    # names a later running step: the steps before it are complete, so no stall.
    for i, now in enumerate((3.0, 5.0, 7.0, 9.0)):
        m.observe(now_s=now, ranks={r: {"last_heartbeat": now, "step": 3 + i}
                                    for r in range(2)})
        assert m.due(now + 0.5) is None
    # Heartbeats still coming, the running step stuck (a hang inside step 6): a stall.
    for now in (10.0, 11.0, 12.0, 13.0):
        m.observe(now_s=now, ranks={r: {"last_heartbeat": now, "step": 6} for r in range(2)})
    due = m.due(13.5)
    assert due is not None and due.trigger == "stall"


def _probe_summaries(times: dict[int, dict[tuple[str, int], float]]) -> dict[int, dict]:
    return {r: {"rank": r, "enter_times": [[pg, seq, t] for (pg, seq), t in ts.items()]}
            for r, ts in times.items()}


def test_a_healthy_noisy_job_probed_on_a_loaded_host_is_not_a_straggler() -> None:
    from tests.unit.watchdog.test_detect import noisy_job

    m = _mon()
    for seed in range(4):
        times = noisy_job(world=2, steps=60, step_s=0.3, jitter_s=0.1, late={0: 0.06},
                          seed=seed)
        steps = sorted(times[0].values())
        for i, (a, b) in enumerate(zip(steps, steps[1:], strict=False)):
            _steps(m, b, i + 1, dt=b - a)
        rep = m.analysis(summaries=_probe_summaries(times), trigger="straggler")
        assert rep.verdict is not Verdict.STRAGGLER, rep.summary
        assert not m.keep_straggler(rep)


def test_a_slow_rank_probed_twice_is_reported_once() -> None:
    from tests.unit.watchdog.test_detect import noisy_job

    m = _mon()
    kept = []
    for seed in range(3):
        times = noisy_job(world=2, steps=40, step_s=0.1, jitter_s=0.03, late={1: 0.2},
                          seed=seed)
        rep = m.analysis(summaries=_probe_summaries(times), trigger="straggler")
        assert (rep.verdict, rep.culprit_ranks) == (Verdict.STRAGGLER, (1,))
        kept.append(m.keep_straggler(rep))
    assert kept == [False, True, False]
