"""The scheduler's order, memory and quotas on a real store and the real planner, against
cluster snapshots built the way the scheduler builds them (no Ray: what is checked is which
jobs the scheduler plans and places, and in what order).

By hand, before: 400 queued jobs were re-planned on every tick (an idle server's CPU went
from 3% to 20% of a core), one user's jobs went strictly first at equal priority, and a
plain user's jobs could hold the whole cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.lifecycle import JobState, Reason
from orchestrator.placement.gang_plan import GangPlan, Pending, plan_job
from orchestrator.placement.snapshot import ClusterSnapshot, RayNode, build_snapshot
from orchestrator.quotas import Quota
from orchestrator.runtime.scheduler import Scheduler
from orchestrator.spec import JobSpec, parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store


def _node(name: str, *, cpus: float = 2, free: float | None = None) -> RayNode:
    return RayNode(node_id=f"id-{name}", ip="127.0.0.1", labels={"meshyard.io/node": name},
                   gpus=0, cpus=cpus, free_gpus=0, free_cpus=cpus if free is None else free)


def _cluster(*nodes: RayNode) -> ClusterSnapshot:
    return build_snapshot(ray_nodes=list(nodes), topology=None)


def _job(store: Store, owner: str, name: str, *, cpus: float = 2, ranks: int = 1,
         **extra: Any) -> JobRecord:
    spec = parse_spec({"name": name, "resources": {"device": "cpu", "cpus_per_worker": cpus},
                       "parallelism": {"dp_replicate": ranks}, **extra})
    return store.submit_job(spec, owner=owner)[0]


class Recording(Scheduler):
    """The real scheduler, with launches recorded (the job moves to PLACING) instead of
    reserving placement groups in Ray, and planner calls counted."""

    def __init__(self, store: Store, tmp: Path, **kw: Any) -> None:
        self.planned: list[str] = []
        self.launched: list[str] = []

        def counting(spec: JobSpec, snap: ClusterSnapshot, **k: Any) -> GangPlan | Pending:
            self.planned.append(spec.name)
            return plan_job(spec, snap, **k)

        super().__init__(store=store, runs_dir=tmp, topology=lambda nodes: None,
                         plan=counting, **kw)

    def _launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
                snap: ClusterSnapshot, *, package_uri: str | None = None) -> None:
        self.store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
        self.launched.append(job.name)

    def pass_(self, snap: ClusterSnapshot, held: list[Any] | None = None) -> list[str]:
        self.planned.clear()
        self.schedule(self.store.queued_jobs(), snap, held=held or [])
        return list(self.planned)


def test_an_idle_tick_does_not_plan_again(store: Store, tmp_path: Path) -> None:
    for i in range(400):  # none fits: 16 CPUs each on a 6-CPU cluster
        _job(store, ("ann", "bob")[i % 2], f"big{i}", cpus=1, ranks=16)
    sched = Recording(store, tmp_path)
    snap = lambda: _cluster(_node("a"), _node("b"), _node("c"))  # noqa: E731 - rebuilt per tick
    assert len(sched.pass_(snap())) == 400
    job = store.queued_jobs()[0]
    assert job.pending_reason is not None and job.pending_reason["kind"] == "infeasible"
    for _ in range(3):  # nothing changed: nothing is planned, however long the queue
        assert sched.pass_(snap()) == []
    _job(store, "cy", "new", cpus=1, ranks=16)
    assert sched.pass_(snap()) == ["new"]  # only the new job
    changed = _cluster(_node("a"), _node("b"), _node("c", free=1))  # a CPU taken elsewhere
    assert len(sched.pass_(changed)) == 401  # the cluster changed: every job again
    assert sched.pass_(changed) == []


def test_users_take_turns_at_equal_priority(store: Store, tmp_path: Path) -> None:
    for i in range(3):
        _job(store, "ann", f"ann{i}")
    _job(store, "bob", "bob0")  # submitted last
    sched = Recording(store, tmp_path)
    sched.pass_(_cluster(_node("a"), _node("b"), _node("c")))  # room for three
    assert sched.launched == ["ann0", "bob0", "ann1"]


def test_a_user_holding_more_waits_behind_one_holding_less(store: Store,
                                                           tmp_path: Path) -> None:
    running = _job(store, "ann", "ann-running", cpus=2, ranks=2)
    for dst in (JobState.PLACING, JobState.STARTING, JobState.RUNNING):
        store.transition(running.id, dst, reason=Reason.PLACEMENT_FOUND)
    _job(store, "ann", "ann-next")
    _job(store, "bob", "bob-next")
    sched = Recording(store, tmp_path)
    active = store.get_job(running.id)
    sched.pass_(_cluster(_node("a"), _node("b"), _node("c")), held=[(active, ())])
    assert sched.launched == ["bob-next", "ann-next"]
    # priority still comes first
    _job(store, "ann", "ann-urgent", priority=-1)
    _job(store, "bob", "bob-low", priority=-2)
    sched.launched.clear()
    sched.pass_(_cluster(_node("a"), _node("b"), _node("c")), held=[(active, ())])
    assert sched.launched == ["ann-urgent", "bob-low"]


def test_running_quotas_hold_jobs_back(store: Store, tmp_path: Path) -> None:
    limits: dict[str, Quota] = {"ann": Quota(max_running_cpus=2)}
    quota_for: Callable[[str], Quota] = lambda owner: limits.get(owner, Quota())  # noqa: E731
    _job(store, "ann", "ann0")
    second = _job(store, "ann", "ann1")
    _job(store, "bob", "bob0")
    sched = Recording(store, tmp_path, quota_for=quota_for)
    sched.pass_(_cluster(_node("a"), _node("b"), _node("c")))
    assert sched.launched == ["ann0", "bob0"]
    reason = store.get_job(second.id).pending_reason
    assert reason is not None and reason["kind"] == "quota"
    assert "max_running_cpus=2" in reason["message"]


def test_fault_injection_stays_out_when_the_server_does_not_allow_it(store: Store,
                                                                      tmp_path: Path) -> None:
    job = _job(store, "ann", "faulty", ranks=2, cpus=0.5,
               inject_fault={"kind": "hang", "rank": 1})
    spec = parse_spec(job.spec)
    snap = _cluster(_node("a"), _node("b"))
    plan = plan_job(spec, snap)
    assert isinstance(plan, GangPlan)
    strict = Scheduler(store=store, runs_dir=tmp_path, topology=lambda n: None,
                       allow_fault_injection=False)
    assert strict._config(job, spec, plan, 1, snap).spec.inject_fault is None
    lenient = Scheduler(store=store, runs_dir=tmp_path, topology=lambda n: None)
    assert lenient._config(job, spec, plan, 1, snap).spec.inject_fault is not None
