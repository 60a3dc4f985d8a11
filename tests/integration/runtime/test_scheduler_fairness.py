"""The scheduler's order, memory and quotas on a real store and the real planner, against
cluster snapshots built the way the scheduler builds them (no Ray: what is checked is which
jobs the scheduler plans and places, and in what order), and one job's failure never ending a
pass.

By hand, before: 400 queued jobs were re-planned on every tick (an idle server's CPU went
from 3% to 20% of a core), one user's jobs went strictly first at equal priority, and a
plain user's jobs could hold the whole cluster.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.admission.quotas import Quota
from orchestrator.lifecycle import JobState, Reason
from orchestrator.placement.gang_plan import GangPlan, Pending, plan_job
from orchestrator.placement.snapshot import ClusterSnapshot, RayNode, build_snapshot
from orchestrator.runtime import launcher as launcher_module
from orchestrator.runtime.scheduler import Scheduler
from orchestrator.spec import JobSpec, parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.usercode import packages


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
        self.launcher.launch = self._record_launch  # type: ignore[method-assign]

    def _record_launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
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


def test_a_job_that_waited_long_goes_before_newer_higher_priority_ones(store: Store,
                                                                       tmp_path: Path) -> None:
    """Aging: one priority level per hour waited, so a priority-0 job queued for 3 h sorts
    with priority-3 jobs submitted now (ahead of them: it was submitted first), and before
    priority-2 ones."""
    from sqlalchemy import update

    from orchestrator.store import models as m

    old = _job(store, "ann", "old")
    _job(store, "bob", "new", priority=2)
    sched = Recording(store, tmp_path)
    sched.pass_(_cluster(_node("a")))  # room for one: priority decides
    assert sched.launched == ["new"]
    _job(store, "bob", "newer", priority=2)
    with store.engine.begin() as c:  # `old` has waited three hours
        c.execute(update(m.Job).where(m.Job.id == old.id)
                  .values(created_at=old.created_at - timedelta(hours=3)))
    sched.launched.clear()
    sched.pass_(_cluster(_node("a")))
    assert sched.launched == ["old"]


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
    spec = job.spec
    snap = _cluster(_node("a"), _node("b"))
    plan = plan_job(spec, snap)
    assert isinstance(plan, GangPlan)
    strict = Scheduler(store=store, runs_dir=tmp_path, topology=lambda n: None,
                       allow_fault_injection=False)
    assert strict.launcher.config(job, spec, plan, 1, snap).spec.inject_fault is None
    lenient = Scheduler(store=store, runs_dir=tmp_path, topology=lambda n: None)
    assert lenient.launcher.config(job, spec, plan, 1, snap).spec.inject_fault is not None


def _damaged_package(root: Path) -> str:
    """A stored package whose directory is valid and whose member fails its CRC (stored
    before uploads were checked whole, or damaged on disk since)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train.py", os.urandom(4096))  # incompressible: deflate stores it
    raw = bytearray(buf.getvalue())
    raw[30 + len("train.py") + 200] ^= 0xFF
    digest = hashlib.sha256(raw).hexdigest()
    root.mkdir(parents=True, exist_ok=True)
    packages.package_path(root, digest).write_bytes(bytes(raw))
    return digest


def test_a_poisoned_job_fails_alone_and_the_pass_places_the_others(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg_dir = tmp_path / "packages"
    digest = _damaged_package(pkg_dir)
    # Ray's GCS stand-in: the node zip is built from the data dir as ensure_in_ray builds it.
    monkeypatch.setattr(launcher_module, "ensure_in_ray",
                        lambda root, d, pin_s: f"gcs://{packages.ray_package(root, d).name}")
    poisoned = _job(store, "mallory", "poisoned", priority=5, entrypoint={
        "command": ["python", "train.py"], "working_dir": f"package:sha256:{digest}"})
    crashing = _job(store, "mallory", "crashing", priority=4)
    _job(store, "bob", "bob0")
    sched = Recording(store, tmp_path, packages_dir=pkg_dir)
    plan = sched._plan

    def planner(spec: JobSpec, snap: ClusterSnapshot, **k: Any) -> GangPlan | Pending:
        if spec.name == "crashing":  # whatever a planner bug raises for one spec
            raise KeyError("tp")
        return plan(spec, snap, **k)

    sched._plan = planner
    sched.pass_(_cluster(_node("a"), _node("b"), _node("c")))
    assert sched.launched == ["bob0"]  # placed in the same pass, after both
    failed = store.get_job(poisoned.id)
    assert (failed.state, failed.failure_reason) == (JobState.FAILED, Reason.SETUP_ERROR)
    assert f"package sha256:{digest} cannot be used" in failed.message
    assert "'train.py'" in failed.message and "Bad CRC-32" in failed.message
    crashed = store.get_job(crashing.id)
    assert (crashed.state, crashed.failure_reason) == (JobState.FAILED, Reason.INTERNAL_ERROR)
    assert "KeyError" in crashed.message
    assert list((pkg_dir / "ray").iterdir()) == []  # no temp zip left behind
