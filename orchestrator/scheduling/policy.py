"""One scheduling pass over an ordered queue under a `Policy`. Pure.

  skip             every job that fits is placed, the rest are skipped (the scheduler's
                   behaviour without reservations: no head-of-line blocking, but a big gang
                   can be overtaken forever)
  fifo             jobs are placed in order until the first that does not fit; everything
                   behind it waits
  reserve          as skip until the first job that does not fit (but could, once running
                   jobs end): it gets a `Reservation`; jobs behind it are placed only where
                   they cannot delay it (reservation.py, backfill)
  reserve_preempt  as reserve, but when that first job would not start within `grace_s`
                   anyway (jobs already told to stop count as ending when they stop) and it
                   outranks running jobs, `choose_preemption`: the victims are asked to
                   checkpoint and stop, and the GPUs they free are reserved for it from
                   `now + grace_s`

A job that can never fit the cluster (planner kind `infeasible`) never takes the reservation.
The queue order (priority with aging, fair share) is the caller's (aging.py,
orchestrator/admission/fairshare.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator.placement.gang_plan import GangPlan, Pending, PendingKind
from orchestrator.placement.snapshot import ClusterSnapshot
from orchestrator.scheduling.jobs import Planner, QueuedJob, RunningJob
from orchestrator.scheduling.preemption import MIN_RUN_S, Preemption, choose_preemption
from orchestrator.scheduling.reservation import Reservation, find_reservation, plan_gpus


class Policy(StrEnum):
    SKIP = "skip"
    FIFO = "fifo"
    RESERVE = "reserve"
    RESERVE_PREEMPT = "reserve_preempt"


@dataclass(frozen=True)
class PassSettings:
    grace_s: float = 60.0  # a preempted job's time to checkpoint and stop
    min_run_s: float = MIN_RUN_S


@dataclass
class PassResult:
    placed: list[tuple[QueuedJob, GangPlan]] = field(default_factory=list)
    reservation: Reservation | None = None
    preemption: Preemption | None = None
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> pending reason
    planner_calls: int = 0


def schedule_pass(order: Sequence[QueuedJob], snap: ClusterSnapshot,
                  running: Sequence[RunningJob], *, now: float, plan: Planner, policy: Policy,
                  settings: PassSettings = PassSettings()) -> PassResult:
    """Places what the policy allows, in `order`, on `snap` (busy GPUs: the running jobs' and
    whatever else is taken); returns the placements, the reservation, the preemption chosen
    and every other job's pending reason."""
    out = PassResult()
    running = list(running)
    failed: set[Hashable] = set()  # shapes that did not fit on this snapshot

    def counted(job: QueuedJob, s: ClusterSnapshot) -> GangPlan | Pending:
        out.planner_calls += 1
        return plan(job, s)

    def try_plan(job: QueuedJob, s: ClusterSnapshot, key: object) -> GangPlan | Pending:
        if s.free_gpus < job.gpus <= s.total_gpus:  # waits; the planner says why not ever
            return Pending(PendingKind.WAITING, f"needs {job.gpus} GPUs; {s.free_gpus} free "
                           "now (waiting for running jobs)")
        memo = None if job.shape is None else (job.shape, key)
        if memo is not None and memo in failed:
            return Pending(PendingKind.WAITING, "a job of the same shape did not fit in this "
                           "pass")
        got = counted(job, s)
        if isinstance(got, Pending) and memo is not None:
            failed.add(memo)
        return got

    version = 0  # bumps when a placement changes the snapshot
    blocked: QueuedJob | None = None
    for job in order:
        if blocked is not None and policy == Policy.FIFO:
            out.waiting[job.id] = {"kind": PendingKind.WAITING.value,
                                   "message": f"behind {blocked.id} (strict FIFO)"}
            continue
        res = out.reservation
        got = try_plan(job, snap if res is None else res.hide(snap), (version, res is None))
        if isinstance(got, Pending) and res is not None and res.may_backfill(job, now=now):
            got = try_plan(job, snap, (version, True))
        if isinstance(got, GangPlan):
            out.placed.append((job, got))
            snap = snap.reserve(gpus=got.gpus_by_node(), cpus={})
            version += 1
            end = None if job.est_runtime_s is None else now + job.est_runtime_s
            running.append(RunningJob(id=job.id, priority=job.priority,
                                      gpus_by_node=plan_gpus(got), started_at=now,
                                      est_end=end, last_checkpoint_at=now))
            continue
        if res is not None:
            out.waiting[job.id] = dict(got.to_dict(), message=(
                f"{got.message}; GPUs {', '.join(res.nodes)} are reserved for {res.job_id}"
                + ("" if job.est_runtime_s is not None else
                   " and this job has no runtime estimate to backfill with")))
            continue
        out.waiting[job.id] = got.to_dict()
        if got.kind == PendingKind.INFEASIBLE or policy == Policy.SKIP:
            continue
        blocked = job
        if policy == Policy.FIFO:
            continue
        reservation = find_reservation(job, snap, running, now=now, plan=counted)
        soon = (reservation is not None and reservation.start is not None
                and reservation.start <= now + settings.grace_s)
        if policy == Policy.RESERVE_PREEMPT and not soon:
            pre = choose_preemption(job, snap, running, now=now, plan=counted,
                                    min_run_s=settings.min_run_s)
            if pre is not None:
                out.preemption = pre
                reservation = Reservation(job_id=job.id, gpus=pre.gpus,
                                          start=now + settings.grace_s,
                                          waits_for=pre.victims, summary=pre.plan.summary,
                                          preempting=True)
        if reservation is None:  # fits only when more than the running jobs is freed
            continue
        out.reservation = reservation
        out.waiting[job.id] = reservation.reason(got, now=now)
    return out
