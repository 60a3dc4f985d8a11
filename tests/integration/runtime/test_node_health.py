"""Diagnose, cordon, re-place, resume, on the simulated multi-node cluster (package fixture:
n1 and n2 with fake GPUs, keyed by Ray node id through their `meshyard.io/node` labels).

A rank hangs with a NIC error in its log (fault `nic_hang`): the watchdog's first diagnosis
names hardware on that rank's node, the ledger cordons it, and the restart (watchdog.action
restart) is placed on the other node and finishes from the checkpoint.
"""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.nodes.health_policy import NodeState
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_hang_with_hardware_evidence_cordons_the_node_and_resumes_elsewhere(runtime, store):
    spec = tiny_spec("nic-hang", training={"steps": 8},
                     inject_fault={"kind": "nic_hang", "rank": 1, "step": 3, "attempt": 1},
                     watchdog={"stall_timeout_s": 3, "first_step_timeout_s": 120,
                               "action": "restart"})
    job_id = submit(store, spec)
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=300)
    assert job.state == JobState.SUCCEEDED, job.message

    first, second = store.list_attempts(job_id)
    assert first.failure_reason == "HANG_DETECTED"
    bad = {b["node"] for b in first.placement["bundles"]}
    assert len(bad) == 1  # consecutive ranks share a node
    (bad_node,) = bad
    again = {b["node"] for b in second.placement["bundles"]}
    assert bad_node not in again and again <= {"n1", "n2"}
    bad_id = next(b["node_id"] for b in first.placement["bundles"])
    assert all(b["node_id"] != bad_id for b in second.placement["bundles"])

    (diag,) = store.list_diagnoses(job_id)
    assert diag.verdict == "NOT_JOINED" and diag.culprit_ranks == [1]
    entry = store.get_node_health(bad_node)
    assert entry is not None and entry.state == NodeState.CORDONED
    assert entry.until is not None and not entry.permanent
    assert [e.diagnosis_id for e in entry.evidence] == [diag.id]
    assert "NET/IB" in entry.reason or "never entered" in entry.reason
    healthy = store.get_node_health(next(iter(again)))
    assert healthy is None or healthy.state == NodeState.HEALTHY

    events = store.list_events(job_id)
    cordon = [e for e in events if e.reason == "NODE_CORDONED"]
    assert len(cordon) == 1 and cordon[0].data["node"] == bad_node
    assert cordon[0].data["diagnosis_id"] == diag.id
    # the cordon came before the restart was placed
    order = [e.id for e in events]
    placed_again = [e for e in events if e.reason == "PLACEMENT_FOUND" and e.dst == "PLACING"]
    assert order.index(cordon[0].id) < order.index(placed_again[-1].id)
    # the loss continued: the second attempt resumed from the checkpoint, not from step 0
    steps = sorted({m.step for m in store.list_metrics(job_id) if m.attempt == 2})
    assert steps and steps[0] > 1 and steps[-1] == 8

    # the goodput ledger of this job with a restart adds up to its wall time
    from api.routes.job_data import job_goodput

    g = job_goodput(job, store)
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s)
    assert g.seconds["hung"] > 0 and g.seconds["recovering"] > 0, (g.to_dict(), [(e.at, e.dst, e.data) for e in store.list_events(job_id) if e.kind == "state"], [(d.attempt, d.report.get("details")) for d in store.list_diagnoses(job_id)])
    assert g.seconds["productive"] > 0 and 0 < g.ratio < 1
