"""Preemption on the simulated cluster (n1, n2: 2 fake GPUs each): low-priority jobs holding
all four GPUs are stopped for a higher-priority one, save a checkpoint (the built-in loop at
its next step, a script when should_stop() says so; a script that ignores it is killed after
its grace period and keeps its last checkpoint), are requeued with their restart budget
untouched, and resume from that checkpoint once the high-priority job is done."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from orchestrator.lifecycle import AttemptState, JobState, Reason
from orchestrator.settings import Settings
from tests.integration.runtime.conftest import (
    package_settings,
    submit,
    tiny_spec,
    wait_for,
    wait_state,
)
from tests.integration.runtime.usercode_helpers import USER_CODE, user_spec


@pytest.fixture()
def settings(tmp_path: Path, ray_cluster: Cluster) -> Settings:
    # no minimum run time before a job may be preempted
    return package_settings(tmp_path, ray_cluster, preempt_min_run_s=0)


def test_a_low_priority_job_is_preempted_checkpoints_and_resumes(runtime, store):
    # Attempt 1 is slow (1.5 s a step from step 3), so its estimated end is minutes away and
    # waiting for it is not an option; attempt 2 runs at full speed.
    low = submit(store, tiny_spec(
        "low", parallelism={"dp_replicate": 4}, training={"steps": 120},
        checkpoint={"every_steps": 4}, preemption={"grace_s": 30},
        inject_fault={"kind": "slow", "rank": 0, "step": 3, "seconds": 1.5, "attempt": 1}))
    wait_for(store, low, lambda j: j.state == JobState.RUNNING and store.list_checkpoints(low),
             what="RUNNING with a checkpoint")
    high = submit(store, tiny_spec("high", priority=5))

    job = wait_for(store, low, lambda j: any(e.reason == Reason.PREEMPTED.value and e.dst
                                             == JobState.QUEUED.value
                                             for e in store.list_events(j.id)),
                   what="preempted and requeued")
    events = store.list_events(low)
    stop = next(e for e in events if e.dst == JobState.PREEMPTED.value)
    assert stop.data["preempted_by"] == high and "preempted by high" in stop.message
    requeued = next(e for e in events if e.dst == JobState.QUEUED.value
                    and e.reason == Reason.PREEMPTED.value)
    resume_step = requeued.data["resume_step"]
    assert resume_step is not None and resume_step >= 4
    assert store.list_attempts(low)[0].state == AttemptState.PREEMPTED.value
    assert job.state in (JobState.QUEUED, JobState.PLACING, JobState.STARTING, JobState.RUNNING)

    assert wait_state(store, high, *TERMINAL).state == JobState.SUCCEEDED
    done = wait_state(store, low, *TERMINAL, timeout_s=300)
    assert done.state == JobState.SUCCEEDED, done.message
    attempts = store.list_attempts(low)
    assert [a.state for a in attempts] == [AttemptState.PREEMPTED.value,
                                           AttemptState.SUCCEEDED.value]
    # attempt 2 continued from the checkpoint saved at the stop, not from step 1
    second = [m for m in store.list_metrics(low, rank=0) if m.attempt == 2]
    assert second and second[0].step == resume_step + 1
    assert done.last_step == 120
    logs = [x.line for x in store.list_logs(low, limit=5000) if x.attempt == 2]
    assert any(f"resumed from checkpoint at step {resume_step}" in line for line in logs)


TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


# Attempt 1 takes a second a step, so the jobs' estimated ends are minutes away when the
# priority job arrives and the scheduler preempts rather than waits for them (it waits for a
# job that ends within scheduler.PREEMPT_IF_LATER_S); attempt 2 runs at full speed.
_STEPS = 150


def _user_job(tmp_path: Path, name: str, *, obey: bool, grace_s: float) -> dict:
    # The code from a path every node reads, not an uploaded package: on this simulated
    # cluster the nodes share one disk, and a resumed attempt whose ranks land on both nodes
    # would have two runtime-env agents unpack the same package over each other.
    code = tmp_path / f"code-{name}"
    shutil.copytree(USER_CODE / "preemptible", code)
    return user_spec(name, {"function": "train:loop", "working_dir": str(code),
                            "config": {"steps": _STEPS, "every": 2, "pace": 1.0,
                                       "obey": obey}},
                     resources={"cpus_per_worker": 0.25, "device": "auto"},
                     preemption={"grace_s": grace_s})


def test_script_jobs_stop_on_should_stop_or_are_killed_after_their_grace(runtime, store,
                                                                         settings, tmp_path):
    """Two script jobs (2 GPUs each) fill the cluster; a 4-GPU priority-5 job preempts both.
    `obeys` sees should_stop(), saves the step it is at and returns; `ignores` carries on
    through SIGTERM and is killed after its 3 s grace. Each resumes from its newest checkpoint
    and its loss continues exactly (s * (s + 1) at every step s, across attempts)."""
    obeys = submit(store, _user_job(tmp_path, "obeys", obey=True, grace_s=30))
    ignores = submit(store, _user_job(tmp_path, "ignores", obey=False, grace_s=3))
    for job_id in (obeys, ignores):
        wait_for(store, job_id, lambda j: j.state == JobState.RUNNING
                 and store.list_checkpoints(j.id), what="RUNNING with a checkpoint")
    high = submit(store, tiny_spec("high", priority=5, parallelism={"dp_replicate": 4}))
    for job_id in (obeys, ignores):
        wait_for(store, job_id, lambda j: any(
            e.reason == Reason.PREEMPTED.value and e.dst == JobState.QUEUED.value
            for e in store.list_events(j.id)), what="preempted and requeued")
        stop = next(e for e in store.list_events(job_id) if e.dst == JobState.PREEMPTED.value)
        assert stop.data["preempted_by"] == high
    assert wait_state(store, high, *TERMINAL).state == JobState.SUCCEEDED
    for job_id in (obeys, ignores):
        done = wait_state(store, job_id, *TERMINAL, timeout_s=300)
        assert done.state == JobState.SUCCEEDED, done.message
        assert [a.state for a in store.list_attempts(job_id)] == [
            AttemptState.PREEMPTED.value, AttemptState.SUCCEEDED.value], [
            (e.at.strftime("%H:%M:%S.%f"), e.kind, e.dst, e.reason, e.message[:160])
            for e in store.list_events(job_id)]
        points = [(m.attempt, m.step, m.loss) for m in store.list_metrics(job_id, rank=0)]
        assert all(loss == s * (s + 1) for _, s, loss in points), points
        assert max(s for _, s, _ in points) == _STEPS
        assert {a for a, _, _ in points} == {1, 2}

    def resumed_at(job_id: str) -> int:
        requeued = next(e for e in store.list_events(job_id) if e.dst == JobState.QUEUED.value
                        and e.reason == Reason.PREEMPTED.value)
        return int(requeued.data["resume_step"])

    def lines(job_id: str, attempt: int) -> list[str]:
        return [x.line for x in store.list_logs(job_id, rank=0, attempt=attempt, limit=5000)]

    # obeys saved the step it stopped at (its last step of attempt 1), then resumed after it
    first = [s for a, s, _ in ((m.attempt, m.step, 0) for m in store.list_metrics(obeys, rank=0))
             if a == 1]
    assert resumed_at(obeys) == max(first)
    assert f"rank 0 asked to stop: saved step {max(first)}" in lines(obeys, 1)
    assert f"rank 0 resumed from step {max(first)}" in lines(obeys, 2)
    # ignores was killed: it resumed from its last periodic checkpoint (an even step)
    assert "rank 0 got SIGTERM, carrying on" in lines(ignores, 1)
    assert not any("asked to stop" in line for line in lines(ignores, 1))
    assert resumed_at(ignores) % 2 == 0
    assert f"rank 0 resumed from step {resumed_at(ignores)}" in lines(ignores, 2)
