"""The scheduler loop: queued jobs -> gang reservation (one placement group) + a controller.

Order: priority (higher first), then fair share between users (orchestrator/fairshare.py:
the owner holding the smallest dominant share of the cluster goes next, counting the jobs
placed earlier in the same tick), then submission order. Every queued job is tried in that
order against what is still free after the jobs placed before it in the same tick; a job
that does not fit records why (`pending_reason`, with numbers) and the scan goes on, so an
infeasible or large job never blocks smaller ones behind it (no head-of-line blocking). The
price is that a large waiting job can be overtaken by smaller ones while it waits.

A job whose owner's running GPU / CPU quota is full waits with `kind: quota`. A job already
told why it waits is not planned again until it or the cluster changes (runtime/plan_memo.py),
so an idle tick costs the same with 10 queued jobs as with 10,000.

Node health (orchestrator/health.py, the ledger in the store): cordoned nodes are avoided like
a job's own avoid list, cordoned GPUs count as busy, and a job is planned without the suspect
nodes first and with them only when it does not fit otherwise.

Placing a job: QUEUED -> PLACING (reason PLACEMENT_FOUND, the solver's summary), a new attempt
with the plan, one detached named placement group with a bundle per rank pinned to the
planned node (`bundle_label_selector` on `ray.io/node-id`), then the attempt's controller,
which waits for the group (spec.placement.timeout_s) and reports back through the poller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ray.util.placement_group import placement_group

from orchestrator.fairshare import Queued, fair_order
from orchestrator.health import HealthPolicy
from orchestrator.lifecycle import JobState, Reason
from orchestrator.packages import PackageError
from orchestrator.placement.gang_plan import GangPlan, Pending, PendingKind, PlanDevice, plan_job
from orchestrator.placement.holds import GpuHold, busy_gpus, gpu_holds
from orchestrator.placement.links import LinkFigures
from orchestrator.placement.snapshot import ClusterSnapshot, RayNode, build_snapshot
from orchestrator.quotas import Quota, Usage, job_size, running_block
from orchestrator.runtime.controller import launch_controller
from orchestrator.runtime.events import AttemptConfig, controller_name, pg_name
from orchestrator.runtime.health import current_view
from orchestrator.runtime.nodes import read_ray_nodes
from orchestrator.runtime.packages import ensure_in_ray
from orchestrator.runtime.plan_memo import PlanMemo
from orchestrator.runtime.policy import AttemptFailure, avoid_nodes, fail_infeasible
from orchestrator.runtime.spares import SpareControllers
from orchestrator.spec import JobSpec, parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.topology.model import ClusterTopology

log = logging.getLogger("meshyard.scheduler")

TopologyFn = Callable[[list[RayNode]], ClusterTopology | None]
PlanFn = Callable[..., GangPlan | Pending]


class Scheduler:
    def __init__(self, *, store: Store, runs_dir: Path, topology: TopologyFn,
                 near_node_id: str | None = None, train_fn: str | None = None,
                 extra_env: dict[str, str] | None = None,
                 launching: set[str] | None = None, use_pool: bool = False,
                 figures: Callable[[], LinkFigures | None] | None = None,
                 quota_for: Callable[[str], Quota] | None = None,
                 allow_fault_injection: bool = True, plan: PlanFn = plan_job,
                 packages_dir: Path | None = None, usage_interval_s: float = 10.0,
                 health_policy: HealthPolicy | None = None,
                 spares: SpareControllers | None = None) -> None:
        self.store = store
        self.spares = spares  # controllers started ahead of the launches (runtime/spares.py)
        self.health_policy = health_policy or HealthPolicy()
        self.usage_interval_s = usage_interval_s
        self._quota_for = quota_for or (lambda owner: Quota())
        self.allow_fault_injection = allow_fault_injection
        self._plan = plan  # the gang planner (tests count its calls)
        self._memo = PlanMemo()
        self._specs: dict[str, JobSpec] = {}  # parsed once: a stored spec never changes
        self.packages_dir = packages_dir  # uploaded user code (orchestrator/packages.py)
        # link figures for the cost model: calibrated ones (meshyard calibrate) when present
        self._figures = figures or (lambda: None)
        self.use_pool = use_pool
        self.launching = launching if launching is not None else set()
        self.runs_dir = runs_dir.resolve()
        self._topology = topology
        self.near_node_id = near_node_id
        self.train_fn = train_fn
        self.extra_env = dict(extra_env or {})

    # -- the cluster now ------------------------------------------------------------------
    def snapshot(self, held: Sequence[tuple[Any, Sequence[GpuHold]]] | None = None
                 ) -> ClusterSnapshot:
        held = gpu_holds(self.store) if held is None else held
        ray_nodes = read_ray_nodes()
        return build_snapshot(ray_nodes=ray_nodes, topology=self._topology(ray_nodes),
                              busy=busy_gpus([h for _, hs in held for h in hs]))

    # -- one pass -----------------------------------------------------------------------------
    def tick(self) -> list[str]:
        """Tries every queued job once; returns the ids placed in this pass."""
        queued = self.store.queued_jobs()
        if not queued:
            self._memo.keep_only(())
            return []
        held = gpu_holds(self.store)
        return self.schedule(queued, self.snapshot(held), held=held)

    def schedule(self, queued: Sequence[JobRecord], snap: ClusterSnapshot, *,
                 held: Sequence[tuple[Any, Sequence[GpuHold]]]) -> list[str]:
        """One pass over `queued` against `snap`; `held`: the active jobs and their GPUs."""
        figures = self._figures()
        self._memo.begin_pass(figures)
        specs = self._parsed(queued)
        usage = self._usage_by_owner(snap, held)
        total = Usage(gpus=snap.total_gpus, cpus=sum(r.cpus for r in snap.ray_nodes))
        gpu_cluster = snap.total_gpus > 0
        by_id = {job.id: job for job in queued if job.id in specs}
        order = fair_order([Queued(j.id, j.owner, j.priority, j.seq,
                                   job_size(specs[j.id], cluster_has_gpus=gpu_cluster))
                            for j in by_id.values()], held=usage, total=total)
        quotas: dict[str, Quota] = {}
        placed: list[str] = []
        health = current_view(self.store, policy=self.health_policy)
        if health.cordoned_gpus:  # a cordoned GPU is never free
            snap = snap.reserve(gpus={k: sorted(v) for k, v in health.cordoned_gpus.items()},
                                cpus={})
        health_key = (health.cordoned, health.suspect)
        fingerprint: Hashable = (self._memo.fingerprint(snap), health_key)
        for q in order:
            job, spec = by_id[q.id], specs[q.id]
            quota = quotas.setdefault(job.owner, self._quota_for(job.owner))
            over = running_block(quota, held=usage.get(job.owner, Usage()), size=q.size)
            if over is not None:
                self._set_pending(job, spec, Pending(PendingKind.QUOTA, over))
                continue
            key = (job.id, job.current_attempt, job.updated_at)
            waiting = self._memo.still_waiting(key, fingerprint)
            if waiting is not None:  # same job, same cluster: the same reason to wait
                if waiting.kind == PendingKind.INFEASIBLE:
                    self._set_pending(job, spec, waiting)  # its placement.timeout_s runs on
                continue
            decision = self._plan_healthy(spec, snap, avoid=self._avoid(job) | health.cordoned,
                                          suspect=health.suspect, figures=figures)
            if isinstance(decision, Pending):
                self._memo.remember(key, fingerprint, decision)
                self._set_pending(job, spec, decision)
                continue
            try:
                package_uri = self._package_uri(spec)
            except (PackageError, OSError, ValueError) as exc:
                self.store.transition(job.id, JobState.FAILED, reason=Reason.SETUP_ERROR,
                                      message=f"entrypoint.working_dir: {exc}")
                continue
            if not self._try_launch(job, spec, decision, snap, package_uri=package_uri):
                continue
            placed.append(job.id)
            usage[job.owner] = usage.get(job.owner, Usage()) + q.size
            snap = snap.reserve(gpus=decision.gpus_by_node(), cpus=decision.cpus_by_node())
            fingerprint = (self._memo.fingerprint(snap), health_key)
        self._memo.keep_only(j.id for j in queued if j.id not in placed)
        return placed

    def _plan_healthy(self, spec: JobSpec, snap: ClusterSnapshot, *, avoid: set[str],
                      suspect: frozenset[str], figures: LinkFigures | None
                      ) -> GangPlan | Pending:
        """Healthy nodes first: the plan without the suspect nodes, else with them
        (cordoned nodes are in `avoid` and never used)."""
        if suspect - avoid:
            first = self._plan(spec, snap, avoid=avoid | suspect, figures=figures)
            if not isinstance(first, Pending):
                return first
        return self._plan(spec, snap, avoid=avoid, figures=figures)

    def _parsed(self, queued: Sequence[JobRecord]) -> dict[str, JobSpec]:
        """Each queued job's spec, parsed once; a stored spec that no longer parses fails."""
        out: dict[str, JobSpec] = {}
        for job in queued:
            spec = self._specs.get(job.id)
            if spec is None:
                try:
                    spec = parse_spec(job.spec)
                except ValueError as exc:  # fail it loudly
                    self.store.transition(job.id, JobState.FAILED, reason=Reason.SETUP_ERROR,
                                          message=f"stored spec is invalid: {exc}")
                    continue
                self._specs[job.id] = spec
            out[job.id] = spec
        if len(self._specs) > 4 * len(queued) + 1024:  # drop specs of jobs long placed
            self._specs = {k: v for k, v in self._specs.items() if k in out}
        return out

    def _usage_by_owner(self, snap: ClusterSnapshot,
                        held: Sequence[tuple[Any, Sequence[GpuHold]]]) -> dict[str, Usage]:
        """What each user's active jobs hold: their GPUs, and their ranks' CPUs."""
        out: dict[str, Usage] = {}
        for job, gpus in held:
            spec = self._specs.get(job.id)
            if spec is None:
                try:
                    spec = self._specs.setdefault(job.id, parse_spec(job.spec))
                except ValueError:
                    continue
            cpus = spec.world_size * spec.resources.cpus_per_worker
            out[job.owner] = out.get(job.owner, Usage()) + Usage(gpus=len(gpus), cpus=cpus)
        return out

    def _try_launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
                    snap: ClusterSnapshot, *, package_uri: str | None) -> bool:
        self.launching.add(job.id)
        try:
            self._launch(job, spec, plan, snap, package_uri=package_uri)
        except Exception:  # noqa: BLE001 - Ray refused: the poller requeues it
            log.exception("launching %s failed", job.id)
            return False
        finally:
            self.launching.discard(job.id)
        return True

    def _avoid(self, job: JobRecord) -> set[str]:
        """Nodes the job's next attempt avoids (`policy.avoid_nodes` over its failures)."""
        if job.current_attempt < 1:
            return set()
        failures = [AttemptFailure.from_event_data(e.data)
                    for e in self.store.list_events(job.id) if e.kind == "error"]
        return avoid_nodes(current_attempt=job.current_attempt, failures=failures)

    def _set_pending(self, job: JobRecord, spec: JobSpec, pending: Pending) -> None:
        """Records why the job waits; one that can never fit fails as INFEASIBLE after
        placement.timeout_s (`policy.fail_infeasible`)."""
        reason = pending.to_dict()
        if pending.kind == PendingKind.INFEASIBLE:
            before = job.pending_reason or {}
            since = before.get("infeasible_since") if before.get("kind") == reason["kind"] \
                else None
            reason["infeasible_since"] = since if isinstance(since, int | float) \
                else time.time()
            timeout = spec.placement.timeout_s
            if fail_infeasible(infeasible_since=reason["infeasible_since"], now=time.time(),
                               timeout_s=timeout,
                               wait_for_capacity=spec.placement.wait_for_capacity):
                self.store.transition(
                    job.id, JobState.FAILED, reason=Reason.INFEASIBLE,
                    message=f"{pending.message.rstrip('.')}. It can never fit this cluster as "
                    f"it is and waited {timeout:g} s (placement.timeout_s); on a cluster that "
                    "grows, set placement.wait_for_capacity: true", data=reason)
                return
        if job.pending_reason != reason:
            self.store.set_pending_reason(job.id, reason)

    def _package_uri(self, spec: JobSpec) -> str | None:
        """The user code's package in Ray (uploaded from the data dir when Ray lacks it)."""
        digest = spec.entrypoint.package if spec.entrypoint is not None else None
        if digest is None:
            return None
        if self.packages_dir is None:
            raise PackageError("this runtime has no package store")
        # Pinned until the workers can have started: placement, then worker start-up.
        pin = spec.placement.timeout_s + min(spec.fault_tolerance.init_timeout_s, 600.0) + 300
        return ensure_in_ray(self.packages_dir, digest, pin_s=pin)

    def _launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan,
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
            config = replace(self._config(job, spec, plan, number, snap),
                             package_uri=package_uri)
            launch_controller(config, near_node_id=self.near_node_id,
                              spare=spare[1] if spare is not None else None)
            adopted = True
        finally:
            if spare is not None and self.spares is not None:
                self.spares.done(spare[0], adopted=adopted)
        log.info("job %s attempt %d: %s", job.id, number, plan.summary)

    def _config(self, job: JobRecord, spec: JobSpec, plan: GangPlan, number: int,
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
            train_fn=self.train_fn, extra_env=self.extra_env, cluster=cluster,
            use_pool=self.use_pool, usage_interval_s=self.usage_interval_s,
            link_figures=self._figures())
