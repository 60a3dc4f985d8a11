"""Two healthy jobs on a loaded host, side by side for over 30 s, one reporting its steps and
one reporting nothing: rank 0 of each enters most collectives last, by ~60 ms of a ~0.4 s
step, with jitter. The straggler probe runs on both and finds no straggler: no diagnosis, and
their node stays healthy in the health ledger."""

from __future__ import annotations

import shutil

from orchestrator.lifecycle import JobState
from orchestrator.nodes.health_policy import NodeState
from tests.integration.runtime.conftest import submit, wait_state
from tests.integration.runtime.usercode_helpers import USER_CODE, ship, user_spec


def test_healthy_noisy_jobs_stay_quiet_and_leave_their_node_healthy(runtime, store, settings,
                                                                   tmp_path):
    jobs = []
    for report in ("1", "0"):
        # Each job its own package (a working dir as a user would upload it per job).
        code = tmp_path / f"noisy-{report}"
        shutil.copytree(USER_CODE / "noisy", code)
        (code / "JOB").write_text(report)
        jobs.append(submit(store, user_spec(
            f"noisy-{report}", {"command": ["python", "train.py"],
                                "working_dir": ship(settings, code),
                                "env": {"REPORT": report, "DURATION_S": "32"}})))
    for job_id in jobs:
        job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=300)
        assert job.state == JobState.SUCCEEDED, (job.message, [
            e.data for e in store.list_events(job_id) if e.kind == "error"])
    for job_id in jobs:
        run = settings.resolved_runs_dir / job_id
        # The time-to-enter probe collected evidence from both ranks at least once.
        probe = run / "diagnostics" / "straggler-probe"
        assert sorted(p.name for p in probe.iterdir() if p.is_dir()) == ["rank0", "rank1"], \
            list(probe.iterdir()) if probe.exists() else "the straggler probe never ran"
        assert store.list_diagnoses(job_id) == []
        assert store.get_job(job_id).condition is None
    nodes = {r.node for job_id in jobs for r in store.list_ranks(job_id)}
    assert nodes
    for node in nodes:
        health = store.get_node_health(node)
        assert health is None or health.state == NodeState.HEALTHY, health
    # The reporting job trained side by side with the other for over 30 s (its step count
    # depends on the host's load; the span of its steps does not).
    times = [m.time for m in store.list_metrics(jobs[0], rank=0)]
    assert len(times) > 30 and max(times) - min(times) > 30, (len(times), times[:3], times[-3:])
