"""Reservations: when a gang that does not fit now will fit, on which GPUs, and who may use
those GPUs meanwhile (backfill). Pure.

The running jobs release their GPUs at their estimated ends (`RunningJob.est_end`: remaining
steps x measured step time, or the max runtime; an end already past counts as now). Freeing
them in that order, the reservation is the first prefix of releases after which the planner
places the gang: its plan's GPUs are the reserved set, so the set is one the gang can use.
Fitting only grows as GPUs are freed, so the prefix is found by bisection (about log2(running)
planner calls). Jobs without an estimate release last, at an unknown time: a gang that needs
their GPUs gets a reservation with `start=None`.

Backfill: a job behind the reservation is placed on the snapshot with the reserved GPUs
hidden when it fits there (it cannot delay the gang); otherwise it may use reserved GPUs only
when its own estimate ends it before the reservation starts (`may_backfill`). A job without
an estimate, or a reservation without a known start, admits no one onto the reserved GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchestrator.placement.gang_plan import GangPlan, Pending, PendingKind
from orchestrator.placement.snapshot import ClusterSnapshot
from orchestrator.scheduling.jobs import Planner, QueuedJob, RunningJob
from orchestrator.topology.model import ClusterNode, ClusterTopology

GpuSet = Mapping[str, tuple[int, ...]]  # node name -> GPU indices


def release(snap: ClusterSnapshot, gpus: Iterable[GpuSet]) -> ClusterSnapshot:
    """A copy of `snap` with the given GPUs free again (their jobs ended or were stopped)."""
    freed: dict[str, set[int]] = {}
    for held in gpus:
        for node, idx in held.items():
            freed.setdefault(node, set()).update(idx)
    if not freed:
        return snap
    nodes = tuple(n if n.name not in freed else ClusterNode(
        name=n.name, topology=n.topology, labels=n.labels, node_id=n.node_id,
        busy_gpus=n.busy_gpus - frozenset(freed[n.name])) for n in snap.cluster.nodes)
    return ClusterSnapshot(cluster=ClusterTopology(levels=snap.cluster.levels, nodes=nodes),
                           ray_nodes=snap.ray_nodes, free_cpus=snap.free_cpus)


def overlaps(a: GpuSet, b: GpuSet) -> bool:
    return any(set(g) & set(b.get(n, ())) for n, g in a.items())


def plan_gpus(plan: GangPlan) -> dict[str, tuple[int, ...]]:
    return {n: tuple(sorted(g)) for n, g in plan.gpus_by_node().items()}


@dataclass(frozen=True)
class Reservation:
    """GPUs held back for `job_id` from `start` on (None: unknown, some job it waits for has
    no estimate). `waits_for`: the running jobs whose GPUs are in the reserved set;
    `preempting`: they were asked to stop for this job (preemption.py)."""

    job_id: str
    gpus: GpuSet
    start: float | None
    waits_for: tuple[str, ...]
    summary: str = ""
    preempting: bool = False

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted(self.gpus))

    def hide(self, snap: ClusterSnapshot) -> ClusterSnapshot:
        """`snap` with the reserved GPUs busy: what a job that must not touch them sees."""
        return snap.reserve(gpus=self.gpus, cpus={})

    def may_backfill(self, job: QueuedJob, *, now: float) -> bool:
        """May `job` use reserved GPUs? Only when its estimate ends it before the start, and
        never GPUs freed by preempting jobs for this one (a stopped victim that took them back
        would only be preempted again)."""
        return (not self.preempting and job.est_runtime_s is not None
                and self.start is not None and now + job.est_runtime_s <= self.start)

    def reason(self, pending: Pending, *, now: float) -> dict[str, Any]:
        """The job's pending reason: kind `reserved`, the planner's numbers, what it waits
        for and when it expects to start."""
        out = dict(pending.to_dict(), kind=PendingKind.RESERVED.value)
        n = sum(len(g) for g in self.gpus.values())
        on = f"{n} GPUs on {_nodes_text(self.nodes)}"
        jobs = ", ".join(self.waits_for) or "no running job"
        if self.preempting:
            what = f"reserved {on}; preempting {jobs} (checkpoint, then stop)"
        else:
            what = f"reserved {on}; waiting for {jobs} to end"
        if self.start is None:
            when = ("start unknown: a job it waits for has no runtime estimate (it states "
                    "no steps, or has not reported a step time yet)")
        else:
            at = datetime.fromtimestamp(self.start, UTC)
            why = ("once they have stopped (their grace period at most)" if self.preempting
                   else "from running jobs' remaining steps x step time")
            when = (f"expected start {at:%Y-%m-%d %H:%M} UTC "
                    f"(in {_duration(self.start - now)}, {why})")
        out["message"] = f"{what}; {when}"
        out["reservation"] = {"nodes": list(self.nodes), "gpus": n,
                              "expected_start": self.start, "waits_for": list(self.waits_for),
                              "preempting": self.preempting}
        return out


def _nodes_text(nodes: Sequence[str]) -> str:
    return ", ".join(nodes) if len(nodes) <= 4 else f"{', '.join(nodes[:3])} and " \
        f"{len(nodes) - 3} more"


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def release_time(job: RunningJob, *, now: float) -> float:
    """When `job` frees its GPUs: its estimated end (not before now); inf without one."""
    return math.inf if job.est_end is None else max(now, job.est_end)


def find_reservation(job: QueuedJob, snap: ClusterSnapshot, running: Sequence[RunningJob], *,
                     now: float, plan: Planner) -> Reservation | None:
    """The earliest set of GPUs the gang can use, as running jobs end (see the module doc);
    None when it does not fit even with every running job gone."""
    ends = sorted(running, key=lambda r: (release_time(r, now=now), r.id))
    free = snap.free_gpus
    counts = [free]
    for r in ends:  # GPUs free after the first k releases
        counts.append(counts[-1] + r.gpus)

    def fits(k: int) -> GangPlan | None:
        if counts[k] < job.gpus:
            return None
        got = plan(job, release(snap, (r.gpus_by_node for r in ends[:k])))
        return got if isinstance(got, GangPlan) else None

    known = sum(1 for r in ends if r.est_end is not None)
    best = fits(known)
    if best is None:
        if known == len(ends):
            return None
        best = fits(len(ends))
        if best is None:
            return None
        lo, hi = known + 1, len(ends)  # the answer lies in (known, len]
    else:
        lo, hi = 1, known
    while lo < hi:  # smallest k that fits (fitting only grows with k)
        mid = (lo + hi) // 2
        got = fits(mid)
        if got is None:
            lo = mid + 1
        else:
            best, hi = got, mid
    gpus = plan_gpus(best)
    waits = [r for r in ends if overlaps(r.gpus_by_node, gpus)]
    start = max((release_time(r, now=now) for r in waits), default=now)
    return Reservation(job_id=job.id, gpus=gpus, start=None if math.isinf(start) else start,
                       waits_for=tuple(r.id for r in waits), summary=best.summary)
