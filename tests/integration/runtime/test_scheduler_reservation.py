"""Reservations and preemption in the scheduler's pass, on a real store and the real planner, against GPU
snapshots built the way the scheduler builds them (no Ray: launches are recorded).

Cluster: n1 and n2, 2 GPUs each. `a` runs on n1 (10 s a step, 6 steps left: it ends in about
a minute), `b` holds n2's GPU 0 with no estimate. `big` (2 GPUs on one node) does not fit: it
gets n1 reserved from a's estimated end. Jobs behind it use n2's free GPU, never n1's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestrator.lifecycle import JobState, Reason
from orchestrator.placement.gang_plan import GangPlan, plan_job
from orchestrator.placement.holds import GpuHold
from orchestrator.placement.snapshot import ClusterSnapshot, RayNode, build_snapshot
from orchestrator.runtime.scheduler import Scheduler
from orchestrator.spec import JobSpec, parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.topology.declared import parse_cluster_doc

TOPOLOGY = parse_cluster_doc({"levels": ["leaf"], "nodes": [
    {"name": n, "gpus": 2, "intra_node": "nvswitch", "labels": {"leaf": "l0"}}
    for n in ("n1", "n2")]})


def _ray_node(name: str) -> RayNode:
    return RayNode(node_id=f"id-{name}", ip="127.0.0.1", labels={"meshyard.io/node": name},
                   gpus=2, cpus=8, free_gpus=2, free_cpus=8)


def _snapshot(busy: dict[str, list[int]]) -> ClusterSnapshot:
    return build_snapshot(ray_nodes=[_ray_node("n1"), _ray_node("n2")], topology=TOPOLOGY,
                          busy={f"id-{n}": g for n, g in busy.items()})


def _spec(name: str, gpus: int, **extra: Any) -> JobSpec:
    return parse_spec({"name": name, "resources": {"device": "cuda", "cpus_per_worker": 1},
                       "parallelism": {"tp": gpus}, "training": {"steps": 10}, **extra})


class Recording(Scheduler):
    def __init__(self, store: Store, tmp: Path, **kw: Any) -> None:
        self.launched: list[str] = []
        super().__init__(store=store, runs_dir=tmp, topology=lambda nodes: TOPOLOGY,
                         plan=plan_job, **kw)
        self.launcher.launch = self._record_launch  # type: ignore[method-assign]

    def _record_launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
                       snap: ClusterSnapshot, *, package_uri: str | None = None) -> None:
        self.store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
        self.launched.append(job.name)


def _running(store: Store, name: str, gpus: dict[str, list[int]], *,
             step_times: list[float] | None, **extra: Any
             ) -> tuple[JobRecord, tuple[GpuHold, ...]]:
    """A RUNNING job whose attempt holds `gpus`; `step_times`: rank 0's step end times."""
    job = store.submit_job(_spec(name, sum(len(g) for g in gpus.values()), **extra),
                           owner="ann")[0]
    bundles = [{"rank": i, "node": n, "node_id": f"id-{n}", "gpu": g, "coords": {},
                "resources": {"GPU": 1, "CPU": 1}}
               for i, (n, g) in enumerate((n, g) for n, gs in gpus.items() for g in gs)]
    store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
    store.start_attempt(job.id, placement={"bundles": bundles})
    store.transition(job.id, JobState.STARTING, reason=Reason.PLACEMENT_FOUND)
    store.transition(job.id, JobState.RUNNING, reason=Reason.FIRST_STEP)
    if step_times:
        store.add_metrics(job.id, 1, [{"rank": 0, "step": i + 1, "time": t, "loss": 1.0}
                                      for i, t in enumerate(step_times)])
    job = store.get_job(job.id)
    assert job is not None
    holds = tuple(GpuHold(job_id=job.id, node=n, node_id=f"id-{n}", gpu=g, rank=None)
                  for n, gs in gpus.items() for g in gs)
    return job, holds


def test_the_first_job_that_waits_for_gpus_gets_them_reserved(store: Store,
                                                              tmp_path: Path) -> None:
    now = time.time()
    a = _running(store, "a", {"n1": [0, 1]}, step_times=[now - 40, now - 30, now - 20, now - 10])
    b = _running(store, "b", {"n2": [0]}, step_times=None)
    big = store.submit_job(_spec("big", 2, priority=1), owner="bob")[0]
    store.submit_job(_spec("small", 1), owner="cy")
    store.submit_job(_spec("small2", 1), owner="cy")
    sched = Recording(store, tmp_path)
    held = [a, b]
    sched.schedule(store.queued_jobs(), _snapshot({"n1": [0, 1], "n2": [0]}), held=held)

    assert sched.launched == ["small"]  # on n2's free GPU; n1 is held for big
    reason = store.get_job(big.id).pending_reason
    assert reason is not None and reason["kind"] == "reserved"
    res = reason["reservation"]
    assert res["nodes"] == ["n1"] and res["gpus"] == 2 and res["waits_for"] == [a[0].id]
    # a's rank 0 finished step 4 at now - 10, 10 s a step, 6 steps to go
    assert abs(res["expected_start"] - (now + 50)) < 1.0
    assert "expected start" in reason["message"] and a[0].id in reason["message"]
    behind = next(j for j in store.queued_jobs() if j.name == "small2").pending_reason
    assert behind is not None and f"reserved for big ({big.id})" in behind["message"]
    assert "no runtime estimate" in behind["message"]


def test_without_an_estimate_the_start_is_unknown(store: Store, tmp_path: Path) -> None:
    a = _running(store, "a", {"n1": [0, 1]}, step_times=None)
    big = store.submit_job(_spec("big", 2), owner="bob")[0]
    sched = Recording(store, tmp_path)
    sched.schedule(store.queued_jobs(), _snapshot({"n1": [0, 1], "n2": [0, 1]}),
                   held=[a, _running(store, "b", {"n2": [0, 1]}, step_times=None)])
    reason = store.get_job(big.id).pending_reason
    assert reason is not None and reason["kind"] == "reserved"
    assert reason["reservation"]["expected_start"] is None
    assert "start unknown" in reason["message"]


def test_a_cpu_only_cluster_reserves_nothing(store: Store, tmp_path: Path) -> None:
    cpu = RayNode(node_id="id-c", ip="127.0.0.1", labels={"meshyard.io/node": "c"}, gpus=0,
                  cpus=2, free_gpus=0, free_cpus=0)
    job = store.submit_job(parse_spec({"name": "cpu", "resources": {"device": "cpu"}}),
                           owner="ann")[0]
    sched = Recording(store, tmp_path)
    sched.schedule(store.queued_jobs(), build_snapshot(ray_nodes=[cpu], topology=None), held=[])
    reason = store.get_job(job.id).pending_reason
    assert reason is not None and reason["kind"] == "waiting" and "reservation" not in reason


def test_a_higher_priority_job_preempts_the_cheapest_and_reserves_its_gpus(
        store: Store, tmp_path: Path) -> None:
    """`low` and `fixed` fill the cluster; `urgent` (priority 5, 2 GPUs) preempts `low`
    (`fixed` is not preemptible), once: the next pass waits for low's stop."""
    low = _running(store, "low", {"n1": [0, 1]}, step_times=None)
    fixed = _running(store, "fixed", {"n2": [0, 1]}, step_times=None,
                     preemption={"preemptible": False})
    urgent = store.submit_job(_spec("urgent", 2, priority=5), owner="bob")[0]
    sched = Recording(store, tmp_path, preempt_min_run_s=0)
    snap = _snapshot({"n1": [0, 1], "n2": [0, 1]})
    sched.schedule(store.queued_jobs(), snap, held=[low, fixed])

    stopped = store.get_job(low[0].id)
    assert stopped.state == JobState.PREEMPTED
    event = [e for e in store.list_events(low[0].id) if e.dst == JobState.PREEMPTED.value][-1]
    assert event.data["preempted_by"] == urgent.id and "preempted by urgent" in event.message
    assert store.get_job(fixed[0].id).state == JobState.RUNNING
    reason = store.get_job(urgent.id).pending_reason
    assert reason["kind"] == "reserved" and reason["reservation"]["preempting"] is True
    assert reason["reservation"]["waits_for"] == [low[0].id] and "preempting" in reason["message"]
    assert "once they have stopped" in reason["message"]

    # next pass: low is stopping (still holds n1): no second victim, the reservation stands
    sched.schedule(store.queued_jobs(), snap, held=[(stopped, low[1]), fixed])
    assert store.get_job(fixed[0].id).state == JobState.RUNNING and sched.launched == []
    again = store.get_job(urgent.id).pending_reason
    assert again["reservation"]["waits_for"] == [low[0].id]


def test_no_preemption_within_the_minimum_run_time_or_of_equal_priority(
        store: Store, tmp_path: Path) -> None:
    low = _running(store, "low", {"n1": [0, 1], "n2": [0, 1]}, step_times=None)
    store.submit_job(_spec("peer", 2), owner="bob")  # same priority: waits
    store.submit_job(_spec("urgent", 2, priority=5), owner="bob")
    sched = Recording(store, tmp_path)  # default minimum run time: 10 minutes
    sched.schedule(store.queued_jobs(), _snapshot({"n1": [0, 1], "n2": [0, 1]}), held=[low])
    assert store.get_job(low[0].id).state == JobState.RUNNING


def test_a_job_that_ends_before_the_reservation_starts_backfills_onto_it(
        store: Store, tmp_path: Path) -> None:
    """`big` (2 GPUs on one node) gets n1 reserved from a's end (a holds n1's GPU 0, about
    50 s to go; n2 is full). n1's GPU 1 is free meanwhile: `unknown`, first in line after big
    but without an estimate, may not take it; `short` ran 4 of its 10 steps before (1 s a
    step: about 6 s to go) and is queued again: it ends before big starts, so it may."""
    now = time.time()
    a = _running(store, "a", {"n1": [0]}, step_times=[now - 40, now - 30, now - 20, now - 10])
    b = _running(store, "b", {"n2": [0, 1]}, step_times=None)
    big = store.submit_job(_spec("big", 2, priority=2), owner="bob")[0]
    short = _running(store, "short", {"n1": [1]}, step_times=[now - 9, now - 8, now - 7,
                                                              now - 6])[0]
    store.transition(short.id, JobState.RESTARTING, reason=Reason.WORKER_CRASH)
    store.transition(short.id, JobState.QUEUED, reason=Reason.RESTART_SCHEDULED)
    unknown = store.submit_job(_spec("unknown", 1, priority=1), owner="cy")[0]
    sched = Recording(store, tmp_path)
    sched.schedule(store.queued_jobs(), _snapshot({"n1": [0], "n2": [0, 1]}), held=[a, b])

    assert sched.launched == ["short"]
    reason = store.get_job(big.id).pending_reason
    assert reason["kind"] == "reserved" and reason["reservation"]["nodes"] == ["n1"]
    waiting = store.get_job(unknown.id).pending_reason
    assert "reserved for big" in waiting["message"] and "no runtime estimate" in \
        waiting["message"]


def test_a_preempting_job_keeps_its_victims_gpus_while_ray_frees_them(
        store: Store, tmp_path: Path) -> None:
    """`urgent` preempts `low` (n1). low stops and is queued again, but Ray still shows one
    of n1's GPUs in use: urgent does not fit yet, and neither `low` nor `small` (1 GPU) may
    take n1's free GPU meanwhile; urgent gets n1 on the pass after Ray frees it."""
    low = _running(store, "low", {"n1": [0, 1]}, step_times=None)
    fixed = _running(store, "fixed", {"n2": [0, 1]}, step_times=None,
                     preemption={"preemptible": False})
    urgent = store.submit_job(_spec("urgent", 2, priority=5), owner="bob")[0]
    sched = Recording(store, tmp_path, preempt_min_run_s=0)
    sched.schedule(store.queued_jobs(), _snapshot({"n1": [0, 1], "n2": [0, 1]}),
                   held=[low, fixed])
    assert store.get_job(low[0].id).state == JobState.PREEMPTED

    store.transition(low[0].id, JobState.QUEUED, reason=Reason.PREEMPTED)
    store.submit_job(_spec("small", 1), owner="cy")
    lagging = _snapshot({"n1": [1], "n2": [0, 1]})  # low's placement group not yet removed
    sched.schedule(store.queued_jobs(), lagging, held=[fixed])
    assert sched.launched == []
    reason = store.get_job(urgent.id).pending_reason
    assert reason["kind"] == "reserved" and reason["reservation"]["nodes"] == ["n1"]
    assert reason["reservation"]["preempting"] is True
    small = next(j for j in store.queued_jobs() if j.name == "small")
    assert "reserved for urgent" in small.pending_reason["message"]

    sched.schedule(store.queued_jobs(), _snapshot({"n2": [0, 1]}), held=[fixed])
    assert sched.launched == ["urgent"]
    assert store.get_job(low[0].id).state == JobState.QUEUED
