"""Launching a placed job's attempt: PLACING and the attempt row (with its controller's name,
so a restarted control plane finds it), the placement group pinned bundle by bundle to the
planned nodes, the user code's package in Ray, and the attempt's controller (a spare one when
ready) with its `AttemptConfig`. Ray refusing any of it leaves the job for the poller to
requeue; it never ends the scheduler's pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ray.util.placement_group import placement_group

from orchestrator.isolation.modes import JobConfinement
from orchestrator.isolation.runfiles import checkpoint_root
from orchestrator.lifecycle import JobState, Reason
from orchestrator.placement.gang_plan import GangPlan, PlanDevice
from orchestrator.placement.links import LinkFigures
from orchestrator.placement.snapshot import ClusterSnapshot
from orchestrator.runtime.controller import launch_controller
from orchestrator.runtime.events import AttemptConfig, controller_name, pg_name
from orchestrator.runtime.packages import ensure_in_ray
from orchestrator.runtime.spares import SpareControllers
from orchestrator.spec import JobSpec
from orchestrator.storage.object_storage import ObjectStorage
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.topology.model import ClusterTopology
from orchestrator.usercode.packages import PackageError

log = logging.getLogger("meshyard.scheduler")


class AttemptLauncher:
    def __init__(self, *, store: Store, runs_dir: Path, launching: set[str],
                 near_node_id: str | None, use_pool: bool, usage_interval_s: float,
                 fork_workers: bool,
                 figures: Callable[[], LinkFigures | None], allow_fault_injection: bool,
                 packages_dir: Path | None, spares: SpareControllers | None,
                 confinement: JobConfinement | None,
                 checkpoint_storage: Path | None = None,
                 object_storage: ObjectStorage | None = None) -> None:
        self.store = store
        self.runs_dir = runs_dir
        self.launching = launching  # jobs being launched now (the poller leaves them alone)
        self.near_node_id = near_node_id
        self.use_pool = use_pool
        self.fork_workers = fork_workers
        self.usage_interval_s = usage_interval_s
        self.figures = figures
        self.allow_fault_injection = allow_fault_injection
        self.packages_dir = packages_dir  # uploaded user code (orchestrator/usercode/packages.py)
        self.spares = spares  # controllers started ahead of the launches (runtime/spares.py)
        # What every rank of user code is confined to (orchestrator/isolation/modes.py); None:
        # nothing (trusted).
        self.confinement = confinement
        # The cluster's shared checkpoint storage (Settings.checkpoint_storage); None: each
        # job's checkpoints stay under its run dir.
        self.checkpoint_storage = checkpoint_storage
        # The cluster's checkpoint store (Settings.checkpoint_uri); None: none.
        self.object_storage = object_storage

    def try_launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
                    snap: ClusterSnapshot, *, package_uri: str | None) -> bool:
        self.launching.add(job.id)
        try:
            self.launch(job, spec, plan, snap, package_uri=package_uri)
        except Exception:  # noqa: BLE001 - Ray refused: the poller requeues it
            log.exception("launching %s failed", job.id)
            return False
        finally:
            self.launching.discard(job.id)
        return True

    def package_uri(self, spec: JobSpec) -> str | None:
        """The user code's package in Ray (uploaded from the data dir when Ray lacks it)."""
        digest = spec.entrypoint.package if spec.entrypoint is not None else None
        if digest is None:
            return None
        if self.packages_dir is None:
            raise PackageError("this runtime has no package store")
        # Pinned until the workers can have started: placement, then worker start-up.
        pin = spec.placement.timeout_s + min(spec.fault_tolerance.init_timeout_s, 600.0) + 300
        return ensure_in_ray(self.packages_dir, digest, pin_s=pin)

    def launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
                snap: ClusterSnapshot, *, package_uri: str | None = None) -> None:
        number = job.current_attempt + 1
        name = pg_name(job.id, number)
        spare = self.spares.take() if self.spares is not None else None
        adopted = False
        try:
            self.store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND,
                                  message=plan.summary, data={"attempt": number, "pg": name})
            # The controller's name is recorded before it runs the attempt: a restarted
            # control plane finds it by that name.
            controller = spare[0] if spare is not None else controller_name(job.id, number)
            attempt = self.store.start_attempt(job.id, placement=dict(
                plan.to_dict(), pg_name=name, controller=controller))
            assert attempt.number == number, (attempt.number, number)
            placement_group(
                [b.resources for b in plan.bundles],
                bundle_label_selector=[{"ray.io/node-id": str(b.node_id)}
                                       for b in plan.bundles],
                name=name, lifetime="detached")
            config = replace(self.config(job, spec, plan, number, snap),
                             package_uri=package_uri)
            launch_controller(config, near_node_id=self.near_node_id,
                              spare=spare[1] if spare is not None else None)
            adopted = True
        finally:
            if spare is not None and self.spares is not None:
                self.spares.done(spare[0], adopted=adopted)
        log.info("job %s attempt %d: %s", job.id, number, plan.summary)

    def config(self, job: JobRecord, spec: JobSpec, plan: GangPlan, number: int,
                snap: ClusterSnapshot) -> AttemptConfig:
        cluster = None
        if plan.device == PlanDevice.GPU:
            used = {b.node for b in plan.bundles}
            cluster = ClusterTopology(levels=snap.cluster.levels,
                                      nodes=tuple(n for n in snap.cluster.nodes if n.name in used))
        if spec.inject_fault is not None and not self.allow_fault_injection:
            # Stored while the server allowed it, run after a restart that does not: the
            # fault stays out, whatever the spec says.
            log.warning("job %s: inject_fault dropped (fault injection is off)", job.id)
            spec = spec.model_copy(update={"inject_fault": None})
        return AttemptConfig(
            job_id=job.id, attempt=number, spec=spec, bundles=plan.bundles,
            run_dir=str(self.runs_dir / job.id), placement_timeout_s=spec.placement.timeout_s,
            init_timeout_s=min(spec.fault_tolerance.init_timeout_s, 600.0),
            cluster=cluster,
            use_pool=self.use_pool, fork_workers=self.fork_workers,
            usage_interval_s=self.usage_interval_s,
            link_figures=self.figures(), confinement=self.confinement,
            checkpoint_dir=str(checkpoint_root(job.id, runs_dir=self.runs_dir,
                                               storage=self.checkpoint_storage))
            if self.checkpoint_storage is not None else None,
            object_storage=self.object_storage)
