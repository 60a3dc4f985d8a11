"""The scheduler loop: queued jobs -> gang reservation (one placement group) + a controller.

Order: priority (higher first), then fair share between users (orchestrator/admission/fairshare.py:
the owner holding the smallest dominant share of the cluster goes next, counting the jobs
placed earlier in the same tick), then submission order. Every queued job is tried in that
order against what is still free after the jobs placed before it in the same tick; a job
that does not fit records why (`pending_reason`, with numbers) and the scan goes on, so an
infeasible or large job never blocks smaller ones behind it (no head-of-line blocking).

Reservation: the first GPU job of the pass that waits for GPUs (not infeasible, not over
quota, not waiting for cordons) gets GPUs reserved (orchestrator/scheduling/reservation.py):
the set the gang can use soonest as the running jobs end (their estimated ends:
runtime/running_jobs.py). Its pending reason (kind `reserved`) names the jobs it waits for
and when it expects to start. Jobs behind it are planned with the reserved GPUs hidden, and
on them only when their own estimate ends them before the reservation starts, so smaller jobs
no longer overtake it forever. A CPU-only cluster reserves nothing (CPU jobs wait as before).

Preemption: when that job's reservation would start later than PREEMPT_IF_LATER_S (or at an
unknown time) and it outranks running jobs (base priority; aging only orders the queue), the
cheapest set of lower-priority preemptible jobs that have run `preempt_min_run_s` in their
attempt and whose GPUs make it fit (scheduling/preemption.py) goes PREEMPTED, an event naming
the preempting job. The poller asks their controllers to stop as a cancel does, with each
job's `preemption.grace_s`; once stopped (after a checkpoint) they are QUEUED again and resume
from it when they fit, their restart budget untouched. The freed GPUs are reserved for the
preempting job meanwhile, and stay reserved until it is placed (at most PREEMPT_HOLD_S past the
victims' grace): Ray can show a stopped victim's GPUs in use for a moment, and a victim
queued again must not take back GPUs the preempting job is about to get.

A job whose owner's running GPU / CPU quota is full waits with `kind: quota`. A job already
told why it waits is not planned again until it or the cluster changes (runtime/plan_memo.py),
so an idle tick costs the same with 10 queued jobs as with 10,000.

Node health (orchestrator/nodes/health_policy.py, the ledger in the store): cordoned nodes
are avoided like a job's own avoid list, cordoned GPUs count as busy, and a job is planned
without the suspect nodes first and with them only when it does not fit otherwise. A job
that fits the cluster only with cordoned nodes waits for them (`kind: cordoned`, naming each
node, its reason and when its cordon ends), and is not failed as infeasible.

Placing a job: QUEUED -> PLACING (reason PLACEMENT_FOUND, the solver's summary), a new attempt
with the plan, one detached named placement group with a bundle per rank pinned to the
planned node (`bundle_label_selector` on `ray.io/node-id`), then the attempt's controller,
which waits for the group (spec.placement.timeout_s) and reports back through the poller.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.admission.fairshare import Queued, fair_order
from orchestrator.admission.quotas import Quota, Usage, job_size, running_block
from orchestrator.isolation.modes import JobConfinement
from orchestrator.lifecycle import IllegalTransition, JobEventKind, JobState, Reason
from orchestrator.nodes.health_policy import HealthPolicy, HealthView
from orchestrator.placement.gang_plan import (
    GangPlan,
    Pending,
    PendingKind,
    plan_job,
    wait_for_cordons,
    wants_gpus,
)
from orchestrator.placement.holds import GpuHold, busy_gpus, gpu_holds
from orchestrator.placement.links import LinkFigures
from orchestrator.placement.snapshot import ClusterSnapshot, RayNode, build_snapshot
from orchestrator.runtime.launcher import AttemptLauncher
from orchestrator.runtime.node_health import current_view
from orchestrator.runtime.nodes import read_ray_nodes
from orchestrator.runtime.plan_memo import PlanMemo
from orchestrator.runtime.policy import fewer_avoided
from orchestrator.runtime.running_jobs import JobEstimates, queued_job, running_jobs
from orchestrator.runtime.spares import SpareControllers
from orchestrator.runtime.waiting import job_avoids, job_failures, record_pending, record_reason
from orchestrator.scheduling.aging import effective_priority
from orchestrator.scheduling.jobs import Planner, QueuedJob, RunningJob
from orchestrator.scheduling.preemption import MIN_RUN_S, choose_preemption
from orchestrator.scheduling.reservation import (
    Reservation,
    find_reservation,
    plan_gpus,
    release_time,
)
from orchestrator.spec import JobSpec
from orchestrator.storage.object_storage import ObjectStorage
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.topology.model import ClusterTopology
from orchestrator.usercode.packages import PackageError

log = logging.getLogger("meshyard.scheduler")
# A reservation that starts later than this (or at an unknown time) is worth preempting for.
PREEMPT_IF_LATER_S = 60.0
# A preempting job keeps the GPUs its victims free this long after their grace ends (Ray may
# still show them in use for a moment after a victim stopped).
PREEMPT_HOLD_S = 60.0

TopologyFn = Callable[[list[RayNode]], ClusterTopology | None]
PlanFn = Callable[..., GangPlan | Pending]


class Scheduler:
    def __init__(self, *, store: Store, runs_dir: Path, topology: TopologyFn,
                 near_node_id: str | None = None,
                 launching: set[str] | None = None, use_pool: bool = False,
                 fork_workers: bool = True,
                 figures: Callable[[], LinkFigures | None] | None = None,
                 quota_for: Callable[[str], Quota] | None = None,
                 allow_fault_injection: bool = True, plan: PlanFn = plan_job,
                 packages_dir: Path | None = None, usage_interval_s: float = 10.0,
                 health_policy: HealthPolicy | None = None,
                 spares: SpareControllers | None = None,
                 confinement: JobConfinement | None = None, preemption: bool = True,
                 preempt_min_run_s: float = MIN_RUN_S,
                 checkpoint_storage: Path | None = None,
                 object_storage: ObjectStorage | None = None) -> None:
        self.store = store
        self.health_policy = health_policy or HealthPolicy()
        self._quota_for = quota_for or (lambda owner: Quota())
        self._plan = plan  # the gang planner (tests count its calls)
        self._memo = PlanMemo()
        self._preemption = preemption
        self._min_run_s = preempt_min_run_s
        self._estimates = JobEstimates(store)  # running jobs' ends, queued jobs' runtimes
        self._pass: _Pass | None = None
        # the reserved job's last planned reservation (its key: job, cluster, running jobs)
        self._reservations: dict[str, tuple[Hashable, Reservation | None]] = {}
        # a preempting job's reservation of its victims' GPUs, until it is placed or the
        # deadline passes (`_preempt`)
        self._preempting: dict[str, tuple[Reservation, float]] = {}
        self._specs: dict[str, JobSpec] = {}  # parsed once: a stored spec never changes
        self._avoid_dropped: set[tuple[str, int]] = set()
        # link figures for the cost model: calibrated ones (meshyard calibrate) when present
        self._figures = figures or (lambda: None)
        self.launching = launching if launching is not None else set()
        self._topology = topology
        self.launcher = AttemptLauncher(
            store=store, runs_dir=runs_dir.resolve(), launching=self.launching,
            near_node_id=near_node_id, use_pool=use_pool, fork_workers=fork_workers,
            usage_interval_s=usage_interval_s,
            figures=self._figures, allow_fault_injection=allow_fault_injection,
            packages_dir=packages_dir, spares=spares, confinement=confinement,
            checkpoint_storage=checkpoint_storage, object_storage=object_storage)

    # -- the cluster now ------------------------------------------------------------------
    def snapshot(self, held: Sequence[tuple[Any, Sequence[GpuHold]]] | None = None
                 ) -> ClusterSnapshot:
        held = gpu_holds(self.store) if held is None else held
        ray_nodes = read_ray_nodes(self.store)
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
        now = time.time()  # aging: a job's priority rises with its wait (scheduling/aging.py)
        order = fair_order([Queued(j.id, j.owner, effective_priority(
                                       j.priority, waited_s=now - j.created_at.timestamp()),
                                   j.seq, job_size(specs[j.id], cluster_has_gpus=gpu_cluster))
                            for j in by_id.values()], held=usage, total=total)
        quotas: dict[str, Quota] = {}
        placed: list[str] = []
        health = current_view(self.store, policy=self.health_policy)
        if health.cordoned_gpus:  # a cordoned GPU is never free
            snap = snap.reserve(gpus={k: sorted(v) for k, v in health.cordoned_gpus.items()},
                                cpus={})
        health_key = (health.cordoned, health.suspect)
        fingerprint: Hashable = (self._memo.fingerprint(snap), health_key)
        self._pass = _Pass(held=held, now=now, health=health, figures=figures)
        for q in order:
            job, spec = by_id[q.id], specs[q.id]
            try:  # one job's problem fails that job and never ends the pass
                quota = quotas.setdefault(job.owner, self._quota_for(job.owner))
                decide = functools.partial(self._decide, job, spec, q.size, quota=quota,
                                           usage=usage, health=health, figures=figures)
                res = self._pass.reservation
                if res is None:
                    decision = decide(snap=snap, fingerprint=fingerprint)
                else:  # first without the reserved GPUs; on them only if it ends in time
                    hidden = self._pass.hidden(snap, memo=self._memo, health_key=health_key)
                    decision = decide(snap=hidden[0], fingerprint=hidden[1])
                    if isinstance(decision, Pending) and decision.kind != PendingKind.QUOTA \
                            and res.may_backfill(self._queued(job, spec, snap), now=now):
                        decision = decide(snap=snap, fingerprint=fingerprint)
                if isinstance(decision, Pending):
                    self._wait(job, spec, decision, snap=snap)
                    continue
            except Exception as exc:  # noqa: BLE001
                self._fail_job(job, Reason.INTERNAL_ERROR, exc,
                               prefix="the scheduler could not plan this job (report it)")
                continue
            try:
                package_uri = self.launcher.package_uri(spec)
            except Exception as exc:  # noqa: BLE001 - BadZipFile, OSError, PackageError, Ray
                digest = spec.entrypoint.package if spec.entrypoint is not None else None
                self._fail_job(job, Reason.SETUP_ERROR, exc, prefix=(
                    f"entrypoint.working_dir: package sha256:{digest} cannot be used "
                    "(upload the code again and resubmit)"))
                continue
            if not self.launcher.try_launch(job, spec, decision, snap, package_uri=package_uri):
                continue
            placed.append(job.id)
            usage[job.owner] = usage.get(job.owner, Usage()) + q.size
            snap = snap.reserve(gpus=decision.gpus_by_node(), cpus=decision.cpus_by_node())
            fingerprint = (self._memo.fingerprint(snap), health_key)
            self._pass.placed_now(job, decision, self._queued(job, spec, snap))
        self._memo.keep_only(j.id for j in queued if j.id not in placed)
        self._preempting = {k: v for k, v in self._preempting.items()
                            if k in by_id and k not in placed and v[1] > now}
        self._estimates.forget({j.id for j in queued} | {j.id for j, _ in held})
        return placed

    # -- reservations -------------------------------------------------------------------------
    def _queued(self, job: JobRecord, spec: JobSpec, snap: ClusterSnapshot) -> QueuedJob:
        gpus = spec.world_size * spec.resources.gpus_per_worker if wants_gpus(spec, snap) else 0
        return queued_job(job, gpus=gpus, estimates=self._estimates)

    def _wait(self, job: JobRecord, spec: JobSpec, pending: Pending, *,
              snap: ClusterSnapshot) -> None:
        """Records why the job waits. The first GPU job of the pass that waits for GPUs
        (not infeasible, not over quota, not waiting for cordons) gets the reservation."""
        p = self._pass
        assert p is not None
        if pending.kind not in (PendingKind.WAITING, PendingKind.FRAGMENTED) \
                or not wants_gpus(spec, snap):
            self._set_pending(job, spec, pending)
            return
        if p.reservation is not None:  # behind the reservation
            held_back, name = p.reservation, p.reserved_name
            nodes = ", ".join(held_back.nodes)
            note = "" if self._queued(job, spec, snap).est_runtime_s is not None else \
                " and this job has no runtime estimate to backfill with"
            self._set_pending(job, spec, replace(pending, message=(
                f"{pending.message}; GPUs on {nodes} are reserved for {name} "
                f"({held_back.job_id}){note}")))
            return
        kept = self._preempting.get(job.id)
        if kept is not None and kept[1] > p.now:
            # Its victims' GPUs stay its own while they stop and Ray frees them: a job queued
            # behind it (a victim itself, resumed) must not take them back meanwhile.
            res: Reservation | None = replace(kept[0], start=max(kept[0].start or p.now, p.now))
        else:
            res = self._reserve(job, spec, snap)
            if self._preemption and not self._starts_soon(res):
                res = self._preempt(job, spec, snap) or res
        if res is None:  # fits only when more than the running jobs is freed
            self._set_pending(job, spec, pending)
            return
        p.reservation, p.reserved_name = res, job.name
        record_reason(self.store, job, res.reason(pending, now=p.now))

    def _starts_soon(self, res: Reservation | None) -> bool:
        """Not worth preempting for: the reservation starts within `PREEMPT_IF_LATER_S`, or
        every job it waits for is stopping already."""
        if res is None:
            return False
        p = self._pass
        assert p is not None
        if res.waits_for and set(res.waits_for) <= p.stopping:
            return True
        return res.start is not None and res.start <= p.now + PREEMPT_IF_LATER_S

    def _planner(self, job: JobRecord, spec: JobSpec) -> Planner:
        p = self._pass
        assert p is not None
        avoid = self._avoid(job) | p.health.cordoned

        def plan(_: QueuedJob, s: ClusterSnapshot) -> GangPlan | Pending:
            return self._plan_healthy(spec, s, avoid=avoid, suspect=p.health.suspect,
                                      figures=p.figures)
        return plan

    def _preempt(self, job: JobRecord, spec: JobSpec, snap: ClusterSnapshot
                 ) -> Reservation | None:
        """Stops the cheapest set of lower-priority preemptible jobs whose GPUs make the job
        fit (scheduling/preemption.py): each goes PREEMPTED (the poller asks its controller
        to checkpoint and stop) and the GPUs they free are reserved for the job."""
        p = self._pass
        assert p is not None
        pre = choose_preemption(self._queued(job, spec, snap), snap,
                                p.running(self._estimates, self._specs), now=p.now,
                                plan=self._planner(job, spec), min_run_s=self._min_run_s)
        if pre is None:
            return None
        stopped: list[str] = []
        grace = 0.0
        for victim_id in pre.victims:
            victim_spec = self._specs.get(victim_id)
            g = victim_spec.preemption.grace_s if victim_spec is not None else 60.0
            try:
                self.store.transition(
                    victim_id, JobState.PREEMPTED, reason=Reason.PREEMPTED,
                    message=f"preempted by {job.name} ({job.id}, priority {job.priority}): "
                    f"its ranks checkpoint and stop within {g:g} s, then it is queued again "
                    "and resumes from that checkpoint",
                    data={"preempted_by": job.id, "preempted_by_name": job.name,
                          "priority": job.priority, "grace_s": g})
            except IllegalTransition:  # it ended or changed meanwhile: its GPUs are not ours
                continue
            stopped.append(victim_id)
            grace = max(grace, g)
            p.stopping.add(victim_id)
        if not stopped:
            return None
        self.store.add_event(job.id, kind=JobEventKind.INFO, reason=Reason.PREEMPTED.value,
                             message=f"preempting {', '.join(stopped)} to make room "
                             f"({pre.lost_gpu_s:.0f} GPU-s of work since their checkpoints)",
                             data={"preempting": stopped})
        res = Reservation(job_id=job.id, gpus=pre.gpus, start=p.now + grace,
                          waits_for=tuple(stopped), summary=pre.plan.summary, preempting=True)
        self._preempting[job.id] = (res, p.now + grace + PREEMPT_HOLD_S)
        return res

    def _reserve(self, job: JobRecord, spec: JobSpec, snap: ClusterSnapshot
                 ) -> Reservation | None:
        """The job's reservation from the running jobs' estimated ends (reservation.py). The
        reserved set is planned again only when the job, the cluster or the running jobs
        changed; its start follows the running jobs' estimates every pass."""
        p = self._pass
        assert p is not None
        running = p.running(self._estimates, self._specs)
        now = p.now
        order = sorted(running, key=lambda r: (release_time(r, now=now), r.id))
        key = (job.id, job.current_attempt, job.updated_at, self._memo.fingerprint(snap),
               tuple((r.id, tuple(r.gpus_by_node.items()), r.est_end is None) for r in order))
        hit = self._reservations.get(job.id)
        if hit is not None and hit[0] == key:
            found = hit[1]
        else:
            found = find_reservation(self._queued(job, spec, snap), snap, running, now=now,
                                     plan=self._planner(job, spec))
            self._reservations = {job.id: (key, found)}
        if found is None:
            return None
        waits = [r for r in running if r.id in found.waits_for]
        start = max((release_time(r, now=now) for r in waits), default=now)
        return replace(found, start=None if math.isinf(start) else start,
                       preempting=bool(found.waits_for) and set(found.waits_for) <= p.stopping)

    def _decide(self, job: JobRecord, spec: JobSpec, size: Usage, *, quota: Quota,
                usage: dict[str, Usage], snap: ClusterSnapshot, fingerprint: Hashable,
                health: HealthView, figures: LinkFigures | None) -> GangPlan | Pending:
        """The job's plan on `snap`, or why it waits (the caller records it)."""
        over = running_block(quota, held=usage.get(job.owner, Usage()), size=size)
        if over is not None:
            return Pending(PendingKind.QUOTA, over)
        key = (job.id, job.current_attempt, job.updated_at)
        waiting = self._memo.still_waiting(key, fingerprint)
        if waiting is not None:  # same job, same cluster: the same reason to wait
            return waiting
        avoid = self._avoid(job)
        decision = self._plan_healthy(spec, snap, avoid=avoid | health.cordoned,
                                      suspect=health.suspect, figures=figures)
        if avoid and isinstance(decision, Pending) and decision.kind == PendingKind.INFEASIBLE:
            # Avoiding the nodes its failed attempts point at never makes a job unplaceable:
            # when nothing else fits it, it avoids fewer of them, those the most failures
            # named kept longest, down to none (and says so).
            for keep in fewer_avoided(avoid, job_failures(self.store, job)):
                again = self._plan_healthy(spec, snap, avoid=set(keep) | health.cordoned,
                                           suspect=health.suspect, figures=figures)
                if not (isinstance(again, Pending) and again.kind == PendingKind.INFEASIBLE):
                    self._note_avoid_dropped(job, avoid - set(keep))
                    avoid, decision = set(keep), again
                    break
        if isinstance(decision, Pending) and decision.kind == PendingKind.INFEASIBLE:
            decision = self._around_cordons(decision, spec, snap, avoid=avoid, health=health,
                                            figures=figures)
        if isinstance(decision, Pending):
            self._memo.remember(key, fingerprint, decision)
        return decision

    def _around_cordons(self, infeasible: Pending, spec: JobSpec, snap: ClusterSnapshot, *,
                        avoid: set[str], health: HealthView,
                        figures: LinkFigures | None) -> Pending:
        """A job that never fits without the cordoned nodes but fits with them waits for the
        cordons (`wait_for_cordons`), instead of failing as INFEASIBLE."""
        mine = avoid | set(spec.placement.avoid_nodes)
        cordons = [c for n, c in sorted(health.cordons.items()) if n not in mine]
        if not cordons:
            return infeasible
        return wait_for_cordons(infeasible, cordons=cordons, with_cordoned=self._plan(
            spec, snap, avoid=avoid, figures=figures))

    def _fail_job(self, job: JobRecord, reason: Reason, exc: Exception, *, prefix: str) -> None:
        """FAILED with `reason` and a message naming the problem (`prefix: exc`)."""
        log.warning("job %s: %s", job.id, prefix, exc_info=exc)
        detail = f"{type(exc).__name__}: {exc}" if not isinstance(exc, PackageError) else exc
        try:
            self.store.transition(job.id, JobState.FAILED, reason=reason,
                                  message=f"{prefix}: {detail}")
        except Exception:  # noqa: BLE001 - the store refused too: the next pass tries again
            log.exception("job %s: could not fail it", job.id)

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
                    spec = job.spec
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
                    spec = self._specs.setdefault(job.id, job.spec)
                except ValueError:
                    continue
            cpus = spec.world_size * spec.resources.cpus_per_worker
            out[job.owner] = out.get(job.owner, Usage()) + Usage(gpus=len(gpus), cpus=cpus)
        return out

    def _note_avoid_dropped(self, job: JobRecord, avoid: set[str]) -> None:
        """One event per attempt: the nodes it would avoid are the only ones it fits on."""
        key = (job.id, job.current_attempt)
        if key in self._avoid_dropped:
            return
        self._avoid_dropped.add(key)
        nodes = ", ".join(sorted(avoid))
        self.store.add_event(job.id, kind=JobEventKind.INFO, reason=Reason.REQUEUED.value,
                             message=f"attempt {job.current_attempt + 1} may use {nodes} again: "
                             "earlier attempts failed there, but the job does not fit while it "
                             "avoids them all",
                             data={"avoid_dropped": sorted(avoid)})

    def _avoid(self, job: JobRecord) -> set[str]:
        return job_avoids(self.store, job)

    def _set_pending(self, job: JobRecord, spec: JobSpec, pending: Pending) -> None:
        record_pending(self.store, job, spec, pending)


@dataclass
class _Pass:
    """One pass's state: its clock and cluster reads, the jobs it placed, the reservation."""

    held: Sequence[tuple[Any, Sequence[GpuHold]]]
    now: float
    health: HealthView
    figures: LinkFigures | None
    reservation: Reservation | None = None
    reserved_name: str = ""
    stopping: set[str] = field(default_factory=set)  # preempted or cancelled: ending now
    _running: list[RunningJob] | None = None
    _placed: list[RunningJob] = field(default_factory=list)
    _hidden: tuple[ClusterSnapshot, tuple[ClusterSnapshot, Hashable]] | None = None

    def running(self, estimates: JobEstimates, specs: dict[str, JobSpec]) -> list[RunningJob]:
        """The active jobs holding GPUs, and the jobs placed earlier in this pass."""
        if self._running is None:
            self._running = running_jobs(self.held, estimates=estimates, specs=specs)
            self.stopping |= {job.id for job, _ in self.held
                              if job.state in (JobState.PREEMPTED, JobState.CANCELLING)}
        return [r if r.id not in self.stopping else replace(r, preemptible=False)
                for r in self._running + self._placed]

    def placed_now(self, job: JobRecord, plan: GangPlan, queued: QueuedJob) -> None:
        est = queued.est_runtime_s
        self._placed.append(RunningJob(
            id=job.id, priority=job.priority, gpus_by_node=plan_gpus(plan), started_at=self.now,
            est_end=None if est is None else self.now + est, last_checkpoint_at=self.now))

    def hidden(self, snap: ClusterSnapshot, *, memo: PlanMemo, health_key: Hashable
               ) -> tuple[ClusterSnapshot, Hashable]:
        """`snap` with the reserved GPUs busy, and its fingerprint (kept until `snap`
        changes)."""
        assert self.reservation is not None
        if self._hidden is None or self._hidden[0] is not snap:
            view = self.reservation.hide(snap)
            self._hidden = (snap, (view, (memo.fingerprint(view), health_key)))
        return self._hidden[1]
