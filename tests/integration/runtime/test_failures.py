"""Worker crashes: restart from the checkpoint while failures are allowed, then FAILED with
the grouped error. Real fault injection (the worker process calls os._exit mid-step)."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import JobState
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state


@pytest.mark.slow
def test_crash_restarts_from_checkpoint_and_loss_continues(runtime, store):
    job_id = submit(store, tiny_spec(
        "crash-once", training={"steps": 6},
        inject_fault={"kind": "crash", "rank": 1, "step": 4, "attempt": 1},
        fault_tolerance={"max_failures": 1}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=150)
    assert job.state == JobState.SUCCEEDED, job.message
    attempts = store.list_attempts(job_id)
    assert [a.state for a in attempts] == ["FAILED", "SUCCEEDED"]
    assert "rank 1" in attempts[0].message and "died" in attempts[0].message
    states = [e.dst for e in store.list_events(job_id) if e.kind == "state"]
    assert states == ["QUEUED", "PLACING", "STARTING", "RUNNING", "RESTARTING", "QUEUED",
                      "PLACING", "STARTING", "RUNNING", "SUCCEEDED"]
    by_attempt: dict[int, dict[int, float]] = {}
    for m in store.list_metrics(job_id, rank=0):
        by_attempt.setdefault(m.attempt, {})[m.step] = m.loss
    first, second = by_attempt[1], by_attempt[2]
    assert max(first) == 3  # crashed at the start of step 4
    assert min(second) == 3  # resumed after the step-2 checkpoint, not from scratch
    assert max(second) == 6
    # same model, optimizer state and data position: step 3 repeats the same loss
    assert second[3] == pytest.approx(first[3], rel=1e-4)
    logs = [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]
    assert any("resumed from checkpoint at step 2" in line for line in logs)


def test_crash_beyond_max_failures_fails_with_the_grouped_error(runtime, store):
    job_id = submit(store, tiny_spec(
        "crash-always", inject_fault={"kind": "crash", "rank": 0, "step": 2, "attempt": None},
        fault_tolerance={"max_failures": 0}))
    job = wait_state(store, job_id, JobState.FAILED, JobState.SUCCEEDED, timeout_s=120)
    assert job.state == JobState.FAILED
    assert job.failure_reason == "MAX_FAILURES"
    err = [e for e in store.list_events(job_id) if e.kind == "error"][-1]
    groups = err.data["groups"]
    assert groups[0]["ranks"] == [0] and groups[0]["signature"].startswith("WorkerDied")
    assert sum(g["count"] for g in groups) <= 2
    assert err.data["failed_nodes"] == [groups[0]["nodes"][0]]
    assert "rank 0 on" in job.message
