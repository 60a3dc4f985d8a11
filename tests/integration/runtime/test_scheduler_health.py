"""The scheduler and the node health ledger on a real store and the real planner (no Ray:
which nodes a job's plan uses). Cordoned nodes are never used, cordoned GPUs count as busy,
suspect nodes only when the job does not fit on healthy ones."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lifecycle import JobState, Reason
from orchestrator.nodes.health_policy import (
    Evidence,
    HealthPolicy,
    Severity,
    admin_cordon,
    admin_uncordon,
)
from orchestrator.placement.gang_plan import GangPlan
from orchestrator.placement.snapshot import ClusterSnapshot, RayNode, build_snapshot
from orchestrator.runtime.node_health import record_evidence
from orchestrator.runtime.scheduler import Scheduler
from orchestrator.spec import JobSpec, parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology

POLICY = HealthPolicy()


def _node(name: str, *, cpus: float = 2, gpus: int = 0) -> RayNode:
    return RayNode(node_id=f"id-{name}", ip="127.0.0.1", labels={"meshyard.io/node": name},
                   gpus=gpus, cpus=cpus, free_gpus=gpus, free_cpus=cpus)


class Recording(Scheduler):
    def __init__(self, store: Store, tmp: Path) -> None:
        self.plans: dict[str, GangPlan] = {}
        super().__init__(store=store, runs_dir=tmp, topology=lambda nodes: None)
        self.launcher.launch = self._record_launch  # type: ignore[method-assign]

    def _record_launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
                       snap: ClusterSnapshot, *, package_uri: str | None = None) -> None:
        self.store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
        self.plans[job.name] = plan


def _submit(store: Store, name: str, **extra: Any) -> JobRecord:
    spec = {"name": name, "resources": {"device": "cpu", "cpus_per_worker": 2}, **extra}
    return store.submit_job(parse_spec(spec), owner="ann")[0]


def _register(store: Store, *names: str) -> None:
    for n in names:
        store.upsert_node(name=n, node_id=f"id-{n}", cpus=2)


def _nodes_of(plan: GangPlan) -> set[str]:
    return {b.node for b in plan.bundles}


@pytest.mark.timeout(60)
def test_cordoned_never_used_suspect_only_when_needed(store: Store, tmp_path: Path) -> None:
    _register(store, "a", "b", "c")
    now = time.time()
    store.update_node_health("a", lambda h: admin_cordon(h, node="a", reason="x", now=now,
                                                         permanent=False, policy=POLICY))
    record_evidence(store, [Evidence(kind="diagnosis", node="b", severity=Severity.SUSPECT,
                                     reason="straggler", at=now, job_id="other")],
                    policy=POLICY)
    sched = Recording(store, tmp_path)
    snap = build_snapshot(ray_nodes=[_node("a"), _node("b"), _node("c")], topology=None)
    _submit(store, "one")
    sched.schedule(store.queued_jobs(), snap, held=[])
    assert _nodes_of(sched.plans["one"]) == {"c"}  # healthy first

    _submit(store, "two", parallelism={"dp_replicate": 2})  # needs b and c: suspect b used
    sched.schedule(store.queued_jobs(), snap, held=[])
    assert _nodes_of(sched.plans["two"]) == {"b", "c"}

    _submit(store, "three", parallelism={"dp_replicate": 3})  # would need cordoned a
    sched.schedule(store.queued_jobs(), snap, held=[])
    job = next(j for j in store.queued_jobs() if j.name == "three")
    assert "three" not in sched.plans and job.pending_reason is not None
    assert job.pending_reason["kind"] == "cordoned"
    assert [c["node"] for c in job.pending_reason["cordoned_nodes"]] == ["a"]

    store.update_node_health("a", lambda h: admin_uncordon(h, node="a", reason="", now=now))
    sched.schedule(store.queued_jobs(), snap, held=[])  # the memo sees the ledger changed
    assert _nodes_of(sched.plans["three"]) == {"a", "b", "c"}


@pytest.mark.timeout(60)
def test_a_cordoned_gpu_is_busy(store: Store, tmp_path: Path) -> None:
    _register(store, "g")
    topo = NodeTopology.uniform(2, "NV2")
    cluster = ClusterTopology(levels=(), nodes=(ClusterNode(name="g", topology=topo,
                                                             node_id="id-g"),))
    record_evidence(store, [Evidence(kind="diagnosis", node="g", gpu=0,
                                     severity=Severity.CORDON, reason="Xid 79",
                                     at=time.time(), job_id="other")], policy=POLICY)
    sched = Recording(store, tmp_path)
    snap = build_snapshot(ray_nodes=[_node("g", cpus=8, gpus=2)], topology=cluster)
    store.submit_job(parse_spec({"name": "gpu", "resources": {"device": "cuda"}}), owner="ann")
    sched.schedule(store.queued_jobs(), snap, held=[])
    assert [b.gpu for b in sched.plans["gpu"].bundles] == [1]
    store.submit_job(parse_spec({"name": "gpu2", "resources": {"device": "cuda"},
                                 "parallelism": {"dp_replicate": 2}}), owner="ann")
    sched.schedule(store.queued_jobs(), snap, held=[])
    assert "gpu2" not in sched.plans


@pytest.mark.timeout(60)
def test_a_job_whose_only_nodes_are_cordoned_waits_past_its_placement_timeout(
        store: Store, tmp_path: Path) -> None:
    # A maintenance window is not "never fits": the job waits for the cordon, told which
    # node, why and until when, and its placement.timeout_s does not fail it.
    _register(store, "a")
    now = time.time()
    store.update_node_health("a", lambda h: admin_cordon(h, node="a", reason="maintenance",
                                                         now=now, permanent=False,
                                                         policy=POLICY))
    sched = Recording(store, tmp_path)
    snap = build_snapshot(ray_nodes=[_node("a")], topology=None)
    _submit(store, "one", placement={"timeout_s": 0.01})
    for _ in range(3):
        sched.schedule(store.queued_jobs(), snap, held=[])
        time.sleep(0.02)
    assert [j.name for j in store.queued_jobs()] == ["one"]
    reason = store.queued_jobs()[0].pending_reason
    assert reason is not None and reason["kind"] == "cordoned"
    assert reason["cordoned_nodes"] == [{"node": "a", "reason": "cordoned by admin: maintenance",
                                         "until": pytest.approx(now + POLICY.cordon_s),
                                         "permanent": False}]
    assert reason["message"].startswith("waiting for cordoned node a (cordoned by admin: "
                                        "maintenance) until ")
