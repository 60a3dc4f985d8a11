"""A job submitted to the store trains on the simulated cluster, where the solver said."""

from __future__ import annotations

import ray

from orchestrator.lifecycle import JobState
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state


def test_gang_lands_where_planned_and_trains(runtime, store):
    job_id = submit(store, tiny_spec("happy", parallelism={"tp": 2, "dp_shard": 2}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=45)
    assert job.state == JobState.SUCCEEDED, job.message

    attempt = store.list_attempts(job_id)[-1]
    plan = attempt.placement
    assert plan["device"] == "gpu" and len(plan["bundles"]) == 4
    # the placement group put every bundle on the node the solver chose
    table = ray.util.placement_group_table()
    # (the group is removed at the end; the plan's node ids are the ones the actors reported)
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
    assert ranks[3].coords == {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "tp": 1}
    states = [e.dst for e in store.list_events(job_id) if e.kind == "state"]
    assert states == ["QUEUED", "PLACING", "STARTING", "RUNNING", "SUCCEEDED"], [
        (e.dst, e.reason, e.message[:200]) for e in store.list_events(job_id)]
    metrics = store.list_metrics(job_id, rank=0)
    assert [m.step for m in metrics] == list(range(1, 7))
    assert store.list_logs(job_id, rank=1)
    assert not [p for p in table.values()
                if p["name"].startswith(f"meshyard-pg-{job_id}") and p["state"] != "REMOVED"]
