"""Restart policy decisions on a real store, without Ray: which nodes a restarted job avoids,
and when failures turn into FAILED / MAX_FAILURES (the poller's policy)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.admission.quotas import Quota, job_size
from orchestrator.lifecycle import JobState, Reason
from orchestrator.nodes.health_policy import HealthView
from orchestrator.placement.gang_plan import Pending, plan_job
from orchestrator.placement.snapshot import build_snapshot
from orchestrator.runtime.poller import Poller
from orchestrator.runtime.scheduler import Scheduler
from tests.integration.runtime.conftest import submit, tiny_spec
from tests.unit.placement.test_gang_plan import DECLARED, _ray


def _fail_attempt(store, poller: Poller, job_id: str, nodes: list[str]) -> None:
    for dst in (JobState.PLACING, JobState.STARTING, JobState.RUNNING):
        store.transition(job_id, dst, reason=Reason.PLACEMENT_FOUND)
    n = store.start_attempt(job_id, placement=None).number
    poller.events.attempt_failed(job_id, n, reason=Reason.WORKER_CRASH, message="rank 0 died",
                           data={"failed_nodes": nodes, "groups": [], "attempt": n})


def test_a_node_that_failed_twice_is_avoided_and_failures_end_in_max_failures(store, tmp_path):
    job_id = submit(store, tiny_spec("flaky-node", fault_tolerance={"max_failures": 2}))
    sched = Scheduler(store=store, runs_dir=Path(tmp_path), topology=lambda nodes: DECLARED)
    poller = Poller(store)

    _fail_attempt(store, poller, job_id, ["n1"])
    job = store.get_job(job_id)
    assert job.state == JobState.QUEUED  # restarted: 1 failure, max_failures=2
    assert sched._avoid(job) == set()  # one failure on n1 is not a pattern yet
    _fail_attempt(store, poller, job_id, ["n1"])
    job = store.get_job(job_id)
    assert job.state == JobState.QUEUED
    assert sched._avoid(job) == {"n1"}

    # The plan for the next attempt leaves n1 out even though it is the tighter fit.
    inv = build_snapshot(ray_nodes=[_ray("n1", gpus=4, free_gpus=2),
                                     _ray("n2", gpus=4, free_gpus=4)], topology=DECLARED)
    spec = job.spec
    assert {b.node for b in plan_job(spec, inv).bundles} == {"n1"}  # type: ignore[union-attr]
    plan = plan_job(spec, inv, avoid=sched._avoid(job))
    assert {b.node for b in plan.bundles} == {"n2"}  # type: ignore[union-attr]
    only_n1 = build_snapshot(ray_nodes=[_ray("n1", gpus=4, free_gpus=4)], topology=DECLARED)
    assert isinstance(plan_job(spec, only_n1, avoid={"n1"}), Pending)

    _fail_attempt(store, poller, job_id, ["n2"])
    job = store.get_job(job_id)
    assert job.state == JobState.FAILED and job.failure_reason == "MAX_FAILURES"
    assert "3 failed attempts (max_failures=2)" in job.message


def test_avoidance_never_makes_a_job_unplaceable(store, tmp_path):
    """Two failed attempts on the only node that fits: the next attempt may use it again (and
    an event says so) instead of waiting as INFEASIBLE until placement.timeout_s fails it."""
    job_id = submit(store, tiny_spec("one-node", fault_tolerance={"max_failures": 5}))
    only_n1 = build_snapshot(ray_nodes=[_ray("n1", gpus=4, free_gpus=4)], topology=DECLARED)
    sched = Scheduler(store=store, runs_dir=Path(tmp_path), topology=lambda nodes: DECLARED)
    poller = Poller(store)
    _fail_attempt(store, poller, job_id, ["n1"])
    _fail_attempt(store, poller, job_id, ["n1"])
    job = store.get_job(job_id)
    assert job.state == JobState.QUEUED and sched._avoid(job) == {"n1"}
    spec = job.spec
    assert isinstance(plan_job(spec, only_n1, avoid={"n1"}), Pending)  # avoiding n1: no fit

    plan = sched._decide(job, spec, job_size(spec, cluster_has_gpus=True), quota=Quota(),
                         usage={}, snap=only_n1, fingerprint=("one-node",),
                         health=HealthView(), figures=None)
    assert plan is not None and {b.node for b in plan.bundles} == {"n1"}
    said = [e for e in store.list_events(job_id) if e.data.get("avoid_dropped")]
    assert len(said) == 1 and "may use n1 again" in said[0].message
    assert store.get_job(job_id).pending_reason is None  # never marked infeasible

