"""A job started from another job's checkpoint (`checkpoint.resume_from`) on the simulated
cluster: its first attempt copies the checkpoint in and trains on from that step with the
loss the source reached (not from initial weights); a checkpoint gone from disk fails the new
job at once with a message naming the setting, without a restart."""

from __future__ import annotations

import shutil

from orchestrator.lifecycle import AttemptState, JobState
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state


def test_a_job_resumes_from_another_jobs_checkpoint(runtime, store, settings):
    src = submit(store, tiny_spec("source", training={"steps": 6}))
    job = wait_state(store, src, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    kept = sorted(c.step for c in store.list_checkpoints(src) if not c.removed)
    assert 4 in kept, kept
    source_loss = {m.step: m.loss for m in store.list_metrics(src, rank=0)}

    resumed = submit(store, tiny_spec("resumed", training={"steps": 8},
                                      checkpoint={"resume_from": {"job": src, "step": 4}}))
    job = wait_state(store, resumed, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    steps = sorted({m.step for m in store.list_metrics(resumed, rank=0)})
    assert steps == [5, 6, 7, 8], steps  # from step 4 on, not from step 1
    loss = {m.step: m.loss for m in store.list_metrics(resumed, rank=0)}
    if loss.get(5) is not None and source_loss.get(5) is not None:
        # the same weights, optimizer state and data position as the source at step 4
        assert abs(loss[5] - source_loss[5]) <= 1e-4 * abs(source_loss[5]) + 1e-6
    logs = [x.line for x in store.list_logs(resumed, rank=0, limit=5000)]
    assert any(f"started from {src}'s checkpoint of step 4" in line for line in logs), logs[:20]
    assert any("resumed from checkpoint at step 4" in line for line in logs)

    # The source's checkpoint removed from disk (while the store still lists it): the next
    # job that names it fails at once, naming the setting, and is not restarted.
    shutil.rmtree(settings.resolved_runs_dir / src / "checkpoints" / "step_00000006")
    gone = submit(store, tiny_spec("gone", fault_tolerance={"max_failures": 2},
                                   checkpoint={"resume_from": {"job": src, "step": 6}}))
    job = wait_state(store, gone, JobState.FAILED, JobState.SUCCEEDED, timeout_s=120)
    assert job.state == JobState.FAILED and job.failure_reason == "SETUP_ERROR", job.message
    assert "checkpoint.resume_from" in job.message and "step 6" in job.message, job.message
    assert [a.state for a in store.list_attempts(gone)] == [AttemptState.FAILED]
