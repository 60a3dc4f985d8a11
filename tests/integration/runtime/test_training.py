"""Jobs through the whole runtime on a simulated 2-node cluster (one Ray cluster for the
module): the gang lands where the solver said and trains; worker crashes restart from the
checkpoint while failures are allowed, then FAIL with the grouped error (real fault
injection: the worker process calls os._exit mid-step)."""

from __future__ import annotations

import time

import pytest
import ray

from orchestrator.lifecycle import JobState
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state


@pytest.mark.slow
def test_gang_lands_where_planned_and_trains(runtime, store):
    job_id = submit(store, tiny_spec("happy", parallelism={"tp": 2, "dp_shard": 2}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message

    attempt = store.list_attempts(job_id)[-1]
    plan = attempt.placement
    assert plan["device"] == "gpu" and len(plan["bundles"]) == 4
    ranks = store.list_ranks(job_id)
    assert [r.rank for r in ranks] == [0, 1, 2, 3]
    planned_nodes = {b["rank"]: b["node_id"] for b in plan["bundles"]}
    for r in ranks:
        assert r.node_id == planned_nodes[r.rank]
        assert r.gpu is not None and r.state == "SUCCEEDED"
    # tp=2 inside one node: ranks (0,1) share a node, (2,3) share the other
    assert ranks[0].node_id == ranks[1].node_id and ranks[2].node_id == ranks[3].node_id
    assert ranks[0].node_id != ranks[2].node_id
    assert {(r.node_id, r.gpu) for r in ranks} == {(b["node_id"], b["gpu"])
                                                  for b in plan["bundles"]}
    assert ranks[3].coords == {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "ep": 0,
                              "cp": 0, "tp": 1}
    states = [e.dst for e in store.list_events(job_id) if e.kind == "state"]
    assert states == ["QUEUED", "PLACING", "STARTING", "RUNNING", "SUCCEEDED"], [
        (e.dst, e.reason, e.message[:200]) for e in store.list_events(job_id)]
    metrics = store.list_metrics(job_id, rank=0)
    assert [m.step for m in metrics] == list(range(1, 7))
    assert store.list_logs(job_id, rank=1)
    # The poller stores SUCCEEDED first and removes the gang's placement group right after
    # (in that order, so a crash in between cannot turn a success into a lost attempt; the
    # orphan sweep removes the group then): the group is gone within a poll or two.
    deadline = time.monotonic() + 30
    while True:
        live = [p for p in ray.util.placement_group_table().values()
                if p["name"].startswith(f"meshyard-pg-{job_id}") and p["state"] != "REMOVED"]
        if not live or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not live


@pytest.mark.slow
def test_crash_restarts_from_checkpoint_and_loss_continues(runtime, store):
    job_id = submit(store, tiny_spec(
        "crash-once", training={"steps": 6},
        inject_fault={"kind": "crash", "rank": 1, "step": 4, "attempt": 1},
        fault_tolerance={"max_failures": 1}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
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
    # Crashed at the start of step 4: attempt 1 has every step done before it. Rows reach a
    # poll at the loop's sync steps (workers/loop/stepsync.py; step 1 always syncs); the steps
    # since the last sync come from the rank's run-dir file, without their loss (the global
    # mean is computed at the sync the crash prevented).
    assert sorted(first) == [1, 2, 3]
    assert first[1] is not None
    assert min(second) == 3  # resumed after the step-2 checkpoint, not from scratch
    assert sorted(second) == [3, 4, 5, 6]
    if first[3] is not None:  # same model, optimizer state and data position: the same loss
        assert second[3] == pytest.approx(first[3], rel=1e-4)
    assert second[3] < first[1]  # trained on from the checkpoint, not from initial weights
    logs = [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]
    assert any("resumed from checkpoint at step 2" in line for line in logs)


def test_crash_beyond_max_failures_fails_with_the_grouped_error(runtime, store):
    job_id = submit(store, tiny_spec(
        "crash-always", inject_fault={"kind": "crash", "rank": 0, "step": 2, "attempt": None},
        fault_tolerance={"max_failures": 0}))
    job = wait_state(store, job_id, JobState.FAILED, JobState.SUCCEEDED, timeout_s=240)
    assert job.state == JobState.FAILED
    assert job.failure_reason == "WORKER_CRASH"  # max_failures=0: no restart, its own reason
    err = [e for e in store.list_events(job_id) if e.kind == "error"][-1]
    groups = err.data["groups"]
    assert groups[0]["ranks"] == [0] and groups[0]["signature"].startswith("WorkerDied")
    assert sum(g["count"] for g in groups) <= 2
    assert err.data["failed_nodes"] == [groups[0]["nodes"][0]]
    assert job.message.startswith("rank 0 on")  # the rank that died, not a peer's fallout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_expert_parallel_job_trains_with_each_ep_group_on_one_node(runtime, store):
    """ep=2 x dp_shard=2 on two 2-GPU nodes: the solver puts each EP group (ranks 0-1, 2-3:
    the all-to-all) on one node and the FSDP pairs (0, 2), (1, 3) across; the MoE job trains
    through the runtime (Ray actors, gloo), checkpointing every 2 steps, and its rows carry
    the load-balancing loss into the store."""
    from tests.integration.runtime.conftest import TINY_MODEL

    job_id = submit(store, tiny_spec(
        "moe-ep", parallelism={"ep": 2, "dp_shard": 2},
        model={**TINY_MODEL, "moe": {"experts": 4, "top_k": 2}}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    ranks = store.list_ranks(job_id)
    assert [r.coords["ep"] for r in ranks] == [0, 1, 0, 1]
    assert ranks[0].node_id == ranks[1].node_id and ranks[2].node_id == ranks[3].node_id
    assert ranks[0].node_id != ranks[2].node_id
    rows = store.list_metrics(job_id, rank=0)
    losses = [m.loss for m in rows]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert all(m.moe_aux_loss is not None and 0.99 < m.moe_aux_loss < 4.0 for m in rows)
    assert any("dp=ep-fsdp" in log.line for log in store.list_logs(job_id, rank=0))
    assert [c.step for c in store.list_checkpoints(job_id) if not c.removed][-1] == 6
