"""Preemption choice: which running jobs a queued higher-priority gang may stop. Pure.

Candidates are running jobs of lower (base) priority that are `preemptible` and have run at
least `min_run_s` in their current attempt (a job just resumed is not stopped again: no
thrash). The choice is the set whose GPUs, freed, let the planner place the gang (so a set
that frees enough GPUs in the wrong places — two half nodes on different leaves for a gang
whose TP groups need whole nodes — is never chosen), cheapest first: least work lost since
the jobs' last checkpoints (GPU-seconds), then fewest jobs, then the fewest GPUs.

Search, within `budget` planner calls:
1. sets in order of rising cost (a best-first walk over the candidates sorted by cost: the
   first set that fits is the cheapest), skipping without a planner call any set that frees
   too few GPUs;
2. when that finds nothing within the budget (big gangs over many small jobs), per topology
   domain (each node, each label value at every level, the whole cluster) the domain's
   candidates cheapest first until the gang fits, then each member dropped again if the gang
   still fits without it; the cheapest of those.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.placement.gang_plan import GangPlan
from orchestrator.placement.snapshot import ClusterSnapshot
from orchestrator.scheduling.jobs import Planner, QueuedJob, RunningJob
from orchestrator.scheduling.reservation import plan_gpus, release

MIN_RUN_S = 600.0  # a job runs at least this long in an attempt before it may be preempted
PLAN_BUDGET = 48  # planner calls one choice may make
_WALK_LIMIT = 4000  # sets looked at in the best-first walk (most skipped without a call)


@dataclass(frozen=True)
class Preemption:
    job_id: str
    victims: tuple[str, ...]  # cheapest first
    lost_gpu_s: float  # work lost since the victims' last checkpoints, GPU-seconds
    plan: GangPlan  # the gang's plan once the victims' GPUs are free

    @property
    def gpus(self) -> dict[str, tuple[int, ...]]:
        return plan_gpus(self.plan)


def candidates(job: QueuedJob, running: Sequence[RunningJob], *, now: float,
               min_run_s: float = MIN_RUN_S) -> list[RunningJob]:
    """The running jobs `job` may preempt, cheapest (least lost work) first."""
    out = [r for r in running if r.preemptible and r.priority < job.priority
           and now - r.started_at >= min_run_s]
    return sorted(out, key=lambda r: (r.lost_work_s(now), r.gpus, r.id))


def choose_preemption(job: QueuedJob, snap: ClusterSnapshot, running: Sequence[RunningJob], *,
                      now: float, plan: Planner, min_run_s: float = MIN_RUN_S,
                      budget: int = PLAN_BUDGET) -> Preemption | None:
    """The cheapest set of running jobs whose GPUs make `job` fit (see the module doc), or
    None: no such set, or none found within `budget` planner calls."""
    cands = candidates(job, running, now=now, min_run_s=min_run_s)
    free = snap.free_gpus
    if not cands or free + sum(c.gpus for c in cands) < job.gpus:
        return None
    calls = [0]

    def fits(chosen: Sequence[RunningJob]) -> GangPlan | None:
        if free + sum(c.gpus for c in chosen) < job.gpus or calls[0] >= budget:
            return None
        calls[0] += 1
        got = plan(job, release(snap, (c.gpus_by_node for c in chosen)))
        return got if isinstance(got, GangPlan) else None

    found = _cheapest_walk(cands, fits, need=job.gpus - free, now=now)
    if found is None:
        found = _by_domain(cands, snap, fits, now=now)
    if found is None:
        return None
    chosen, got = found
    return Preemption(job_id=job.id, victims=tuple(c.id for c in chosen),
                      lost_gpu_s=sum(c.lost_work_s(now) for c in chosen), plan=got)


def _key(chosen: Sequence[RunningJob], now: float) -> tuple[float, int, int]:
    return (sum(c.lost_work_s(now) for c in chosen), len(chosen), sum(c.gpus for c in chosen))


def _cheapest_walk(cands: list[RunningJob], fits, *, need: int, now: float
                   ) -> tuple[list[RunningJob], GangPlan] | None:
    """Index sets of `cands` in order of rising (cost, jobs, GPUs): from a set whose largest
    index is i, the next ones replace i by i+1 or add i+1 (each set is reached once)."""
    costs = [c.lost_work_s(now) for c in cands]
    heap: list[tuple[float, int, int, tuple[int, ...]]] = [
        (costs[0], 1, cands[0].gpus, (0,))]
    seen = 0
    while heap and seen < _WALK_LIMIT:
        cost, n, gpus, idx = heapq.heappop(heap)
        seen += 1
        if gpus >= need:
            chosen = [cands[i] for i in idx]
            got = fits(chosen)
            if got is not None:
                return chosen, got
        last = idx[-1]
        if last + 1 < len(cands):
            j = last + 1
            heapq.heappush(heap, (cost - costs[last] + costs[j], n,
                                  gpus - cands[last].gpus + cands[j].gpus, (*idx[:-1], j)))
            heapq.heappush(heap, (cost + costs[j], n + 1, gpus + cands[j].gpus, (*idx, j)))
    return None


def _by_domain(cands: list[RunningJob], snap: ClusterSnapshot, fits, *, now: float
               ) -> tuple[list[RunningJob], GangPlan] | None:
    cluster = snap.cluster
    where: dict[str, tuple[str, ...]] = {n.name: cluster.path(n) for n in cluster.nodes}
    domains: dict[tuple[str, ...], list[RunningJob]] = {}
    for c in cands:  # a job is in a domain when all its GPUs are
        paths = [(*where.get(n, ()), n) for n in c.gpus_by_node]
        common: tuple[str, ...] = ()
        for parts in zip(*paths, strict=False):
            if len(set(parts)) > 1:
                break
            common = (*common, parts[0])
        for depth in range(len(common) + 1):
            domains.setdefault(common[:depth], []).append(c)
    best: tuple[list[RunningJob], GangPlan] | None = None
    for dom in sorted(domains, key=lambda d: (-len(d), d)):  # finest domains first
        chosen: list[RunningJob] = []
        got = None
        for c in domains[dom]:  # already cheapest first
            chosen.append(c)
            got = fits(chosen)
            if got is not None:
                break
        if got is None:
            continue
        for c in sorted(chosen, key=lambda c: -c.lost_work_s(now)):  # drop what is not needed
            rest = [x for x in chosen if x is not c]
            again = fits(rest) if rest else None
            if again is not None:
                chosen, got = rest, again
        if best is None or _key(chosen, now) < _key(best[0], now):
            best = (chosen, got)
    return best
