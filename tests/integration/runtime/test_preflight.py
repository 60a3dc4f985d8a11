"""The pre-flight check on the simulated multi-node cluster: a rank whose sends start late
(fault `slow_send`) fails the check before step 1; its node is cordoned, the gang is placed
on the other node, passes the check there and trains to the end. A failed check is not one
of the job's max_failures. The same for a user script, checked before its code starts."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.nodes.health_policy import NodeState
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state
from tests.integration.runtime.usercode_helpers import USER_CODE, ship, user_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_slow_sender_fails_preflight_and_the_gang_is_placed_around_it(runtime, store):
    spec = tiny_spec("slow-send", inject_fault={"kind": "slow_send", "rank": 1,
                                                "seconds": 0.5, "attempt": 1},
                     fault_tolerance={"max_failures": 0})
    job_id = submit(store, spec)
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=300)
    assert job.state == JobState.SUCCEEDED, job.message
    first, second = store.list_attempts(job_id)
    assert first.failure_reason == "PREFLIGHT_FAILED"
    assert "p2p 1->0" in first.message and "culprit ranks [1]" in first.message
    (bad,) = {b["node"] for b in first.placement["bundles"]}
    assert f"rank 1 on {bad}" in first.message
    assert "over gloo-loopback" in first.message and "expected" in first.message
    assert bad not in {b["node"] for b in second.placement["bundles"]}
    assert not [m for m in store.list_metrics(job_id) if m.attempt == 1]  # before step 1
    entry = store.get_node_health(bad)
    assert entry is not None and entry.state == NodeState.CORDONED
    assert entry.evidence[-1].kind == "preflight"
    logs = [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]
    assert any("pre-flight check passed" in line for line in logs)  # attempt 2's check


def test_user_script_with_a_slow_sender_is_caught_before_its_code_runs(runtime, store,
                                                                       settings):
    # The script calls init_process_group itself (on MASTER_PORT) and ships its own
    # `workers` / `orchestrator` packages: the check runs before it, in a process of its own.
    ref = ship(settings, USER_CODE / "shadow")
    job_id = submit(store, user_spec(
        "user-slow-send", {"command": ["python", "train.py"], "working_dir": ref},
        resources={"cpus_per_worker": 0.25},
        inject_fault={"kind": "slow_send", "rank": 1, "seconds": 0.5, "attempt": 1}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=300)
    assert job.state == JobState.SUCCEEDED, job.message
    first, second = store.list_attempts(job_id)
    assert first.failure_reason == "PREFLIGHT_FAILED", first.message
    assert "p2p 1->0 over gloo-loopback" in first.message and "culprit ranks [1]" in first.message
    (bad,) = {b["node"] for b in first.placement["bundles"]}
    assert f"rank 1 on {bad}" in first.message
    assert bad not in {b["node"] for b in second.placement["bundles"]}
    run = settings.resolved_runs_dir / job_id
    assert not (run / "logs" / "attempt-1" / "rank-0.reports.jsonl").read_text()  # never ran
    assert [(m.attempt, m.step) for m in store.list_metrics(job_id) if m.rank == 0] == [
        (2, 1), (2, 2), (2, 3)]
    # The check's failure is the attempt's reason; no hang or rank-exit diagnosis beside it.
    assert store.list_diagnoses(job_id) == []
    entry = store.get_node_health(bad)
    assert entry is not None and entry.state == NodeState.CORDONED
    logs = [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]
    assert any("pre-flight check passed" in line for line in logs)  # attempt 2's check
