"""The job condition a diagnosis opens: its headline per verdict, the rank states it implies,
when progress clears it; and the failed attempt's reason and message chosen from it."""

from __future__ import annotations

import pytest

from orchestrator.jobs.status_line import status_line
from orchestrator.lifecycle import JobState, Reason
from orchestrator.runtime.failures import RankFailure, attempt_failed, cause_first
from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.condition import HUNG, STRAGGLING, JobCondition, headline, rank_states
from orchestrator.watchdog.report import DiagnosisReport, Verdict
from tests.unit.watchdog.synth import Job, Op, evidence


def world_job(world: int, n_ops: int = 6, **kw: object) -> Job:
    return Job(world=world, groups={"0": tuple(range(world))},
               program=[Op("0") for _ in range(n_ops)], **kw)  # type: ignore[arg-type]


def test_not_joined_headline_and_rank_states() -> None:
    rep = analyze(evidence(world_job(4, stop_before={1: 3})))
    assert headline(rep) == "rank 1 never entered all_reduce #4"
    states = rank_states(rep)
    assert states[1].state == "not_joined" and states[1].collective == "all_reduce #4"
    assert {r: (s.state, s.collective) for r, s in states.items() if r != 1} == {
        0: ("waiting", "all_reduce #4"), 2: ("waiting", "all_reduce #4"),
        3: ("waiting", "all_reduce #4")}


def test_rank_exited_headline_names_the_exit() -> None:
    rep = analyze(evidence(world_job(4, stop_before={2: 3}), dead={2: "exit code -9"}))
    assert headline(rep) == "rank 2 exited (exit code -9)"
    assert rank_states(rep)[2].state == "exited"
    assert rank_states(rep)[0].state == "waiting"


def test_mismatch_and_non_collective_and_straggler_headlines() -> None:
    rep = analyze(evidence(world_job(4, replace={(3, 2): Op("0", sizes=((99,),))})))
    assert headline(rep) == "rank 3 passed different sizes at collective #3"
    assert rank_states(rep)[3].state == "mismatched"
    rep = analyze(evidence(world_job(2), stacks={r: "_block_forever at /w/workers/faults.py:62"
                                                 for r in range(2)}))
    assert headline(rep) == "every rank blocked outside collectives at _block_forever at " \
                            "faults.py:62"
    assert {s.state for s in rank_states(rep).values()} == {"blocked"}
    rep = analyze(evidence(world_job(4, n_ops=10, delay_s={2: 0.5}), trigger="straggler"))
    assert rep.verdict is Verdict.STRAGGLER
    assert headline(rep).startswith("rank 2 enters collectives ") and "ms late" in headline(rep)
    assert {r: s.state for r, s in rank_states(rep).items()} == {2: "straggler"}


def test_condition_text_roundtrip_and_clearing() -> None:
    rep = analyze(evidence(world_job(3, stop_before={1: 3})))
    c = JobCondition.from_report(rep, diagnosis_id=4, attempt=2, since=1764572181.0, step=14)
    assert c.kind == HUNG
    assert c.text() == "hung since 06:56:21 UTC — rank 1 never entered all_reduce #4"
    assert JobCondition.from_dict(c.to_dict()) == c
    assert c.to_dict()["since"] == "2025-12-01T06:56:21+00:00"
    assert not c.cleared_by(14) and c.cleared_by(15)
    slow = JobCondition.from_report(
        analyze(evidence(world_job(4, n_ops=10, delay_s={2: 0.5}), trigger="straggler")),
        diagnosis_id=5, attempt=1, since=0.0, step=3)
    assert slow.kind == STRAGGLING and not slow.cleared_by(1000)  # it keeps stepping


@pytest.mark.parametrize("state,extra,expected", [
    (JobState.RUNNING, {}, "training: step 37 of 200"),
    (JobState.QUEUED, {"pending_reason": {"kind": "waiting", "message": "needs 4 GPUs"}},
     "waiting: needs 4 GPUs"),
    (JobState.FAILED, {}, "step 1 done"),
    (JobState.RUNNING, {"condition": {"text": "hung since x — rank 1 ..."}},
     "hung since x — rank 1 ..."),
])
def test_status_line(state: JobState, extra: dict, expected: str) -> None:
    assert status_line(state=state, message="step 1 done", last_step=37, total_steps=200,
                       **extra) == expected


def test_status_line_of_a_script_that_states_no_steps() -> None:
    line = status_line(state=JobState.RUNNING, message="", last_step=None, total_steps=0)
    assert line.startswith("running: the script reports no steps") and "of 0" not in line
    assert status_line(state=JobState.RUNNING, message="", last_step=12,
                       total_steps=0) == "training: step 12"


def _crash_failures() -> list[RankFailure]:
    # The peers' "connection reset" reached the controller before the death it reports.
    return [RankFailure(rank=0, error_type="RuntimeError", message="Connection reset by peer",
                        node="n", time=10.0),
            RankFailure(rank=1, error_type="RuntimeError", message="Connection reset by peer",
                        node="n", time=10.1),
            RankFailure(rank=2, error_type="WorkerDied", message="worker process died",
                        node="n", time=10.4)]


def test_a_dead_rank_leads_the_failure_without_a_diagnosis() -> None:
    assert [f.rank for f in cause_first(_crash_failures())] == [2, 0, 1]
    failed = attempt_failed(_crash_failures())
    assert failed.reason == Reason.WORKER_CRASH
    assert failed.message.startswith("rank 2 on n: WorkerDied: worker process died")


def test_a_diagnosed_exit_leads_with_its_culprit() -> None:
    fs = [RankFailure(rank=0, error_type="RuntimeError", message="timeout", time=1.0),
          RankFailure(rank=3, error_type="RuntimeError", message="bad input", time=2.0)]
    cause = DiagnosisReport(verdict=Verdict.RANK_EXITED, culprit_ranks=(3,), confidence=0.9,
                            summary="Rank 3 exited.")
    failed = attempt_failed(fs, cause)
    assert failed.reason == Reason.WORKER_CRASH and failed.message.startswith("rank 3 on ?")


def test_a_hang_then_timeout_fails_as_the_hang_naming_the_culprit() -> None:
    fs = [RankFailure(rank=r, error_type="RuntimeError", message="gloo timeout", time=r)
          for r in (0, 2)]
    cause = analyze(evidence(world_job(3, stop_before={1: 3})))
    failed = attempt_failed(fs, cause)
    assert failed.reason == Reason.HANG_DETECTED
    assert failed.message.startswith("hang detected: Rank 1 ")
    assert "Then 2 ranks (0,2) on ?: RuntimeError: gloo timeout" in failed.message
