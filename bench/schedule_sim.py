"""Trace-driven scheduling simulator: four queue policies on one synthetic trace, fake clock.

    .venv/bin/python bench/schedule_sim.py [--jobs N] [--seed S] [--out PATH.json]

What runs is the real pure scheduling code: the queue order (orchestrator/admission/fairshare.py
with aging from orchestrator/scheduling/aging.py), one pass per scheduling instant
(orchestrator/scheduling/policy.py: reservation, backfill, preemption choice) and the gang
planner + topology-aware solver (orchestrator/placement/gang_plan.py) on a declared cluster of
64 nodes x 8 GPUs (NVSwitch, so one NVLink domain per node), 8 nodes per leaf switch, 4 leaves
per spine. Only time is fake: jobs run for their trace duration, nothing is launched.

Policies (compared on the same trace, ratios against skip, today's scheduler):
  skip             place every job that fits in priority + fair-share order, skip the rest
  fifo             strict priority-then-submission order: stop at the first that does not fit
  reserve          aging + reservation for the first job that does not fit + backfill
  reserve_preempt  reserve, plus preemption for a higher-priority job that cannot fit

The trace follows the shape of the Microsoft Philly analysis (Jeon et al., "Analysis of
Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC 2019): most jobs
use one GPU, a long tail of multi-node gangs, heavy-tailed run times, larger jobs running
longer. The figures used here (an approximation of that paper's job-size and run-time
distributions, scaled down to a 512-GPU cluster and a few simulated days; not a replay):
  GPUs per job: 1: 70 %, 2: 10 %, 4: 8 %, 8: 7 %, 16: 2.5 %, 32: 1.5 %, 64: 1 %
  run time: log-normal, median 30 min x (1 + log2(GPUs) / 2), sigma 1.5, capped at 24 h
  arrivals: Poisson, rate set so the offered load is 95 % of the cluster's GPUs
  priority: 10 % of jobs priority 1 (the rest 0); 8 users
  estimates: 80 % of jobs have one, the true run time x U(0.9, 1.3) (remaining steps x step
  time, or max runtime); the rest none (they never backfill into a reservation)
  checkpoints every 30 min; a preempted job loses the work since its last one and gets
  `grace_s` = 60 s to stop; minimum run before it can be preempted again 10 min
Scheduling passes run at every event, on a 60 s grid (arrival, end, a preempted job stopping).

Reported per policy: mean and p99 job completion time (JCT) by size class, the longest wait of
the largest class (time queued, including after a preemption; jobs unfinished at the end
count with their wait so far), GPU utilisation over the arrival window (busy GPU-seconds /
capacity; `useful` excludes work lost to preemption), and placements that crossed a switch
they need not have: the gang's placement spans a coarser level (node < leaf < spine <
cluster) than the finest domain whose free GPUs, at that moment, could hold it (counted in
whole TP groups per node; reserved GPUs count as free, so this also shows what hiding them
for backfill costs).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.admission.fairshare import Queued, fair_order  # noqa: E402
from orchestrator.admission.quotas import Usage  # noqa: E402
from orchestrator.placement.gang_plan import GangPlan, Pending, plan_job  # noqa: E402
from orchestrator.placement.snapshot import ClusterSnapshot  # noqa: E402
from orchestrator.scheduling.aging import effective_priority  # noqa: E402
from orchestrator.scheduling.jobs import QueuedJob, RunningJob  # noqa: E402
from orchestrator.scheduling.policy import PassSettings, Policy, schedule_pass  # noqa: E402
from orchestrator.spec import JobSpec, parse_spec  # noqa: E402
from orchestrator.topology.declared import parse_cluster_doc  # noqa: E402
from orchestrator.topology.model import ClusterTopology  # noqa: E402

NODES, GPUS_PER_NODE, NODES_PER_LEAF, LEAVES_PER_SPINE = 64, 8, 8, 4
SIZES = [(1, 0.70), (2, 0.10), (4, 0.08), (8, 0.07), (16, 0.025), (32, 0.015), (64, 0.01)]
CLASSES = [("1", 1, 1), ("2-8", 2, 8), ("16-32", 16, 32), ("64", 64, 64)]
LOAD = 1.0
MEDIAN_S, SIGMA, CAP_S = 1800.0, 1.5, 24 * 3600.0
HIGH_SHARE, USERS, EST_SHARE = 0.10, 8, 0.80
CKPT_S, GRACE_S, MIN_RUN_S, GRID_S = 1800.0, 60.0, 600.0, 60.0
LEVELS = ("node", "leaf", "spine", "cluster")


@dataclass
class Job:
    id: str
    gpus: int
    tp: int
    duration: float  # work to do, seconds
    submit: float
    priority: int
    owner: str
    seq: int
    est: float | None
    # simulation state
    remaining: float = 0.0
    started: float | None = None  # current attempt
    first_start: float | None = None
    finish: float | None = None
    ran: float = 0.0  # seconds run over all attempts (lost work included)
    lost: float = 0.0  # seconds of work lost to preemption
    preempted: int = 0
    gpus_by_node: dict[str, tuple[int, ...]] = field(default_factory=dict)
    stopping_at: float | None = None
    end_event: int = 0  # generation of the current end event


def cluster() -> ClusterTopology:
    return parse_cluster_doc({"levels": ["leaf", "spine"], "nodes": [
        {"name": f"n{i:02d}", "gpus": GPUS_PER_NODE, "intra_node": "nvswitch",
         "labels": {"leaf": f"leaf{i // NODES_PER_LEAF}",
                    "spine": f"spine{i // (NODES_PER_LEAF * LEAVES_PER_SPINE)}"}}
        for i in range(NODES)]})


def trace(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    sizes, weights = zip(*SIZES, strict=True)
    drawn = []
    for _ in range(n):
        g = rng.choices(sizes, weights)[0]
        median = MEDIAN_S * (1 + math.log2(g) / 2)
        d = min(CAP_S, max(60.0, rng.lognormvariate(math.log(median), SIGMA)))
        drawn.append((g, d))
    work = sum(g * d for g, d in drawn) / n  # mean GPU-seconds per job
    rate = LOAD * NODES * GPUS_PER_NODE / work  # jobs per second
    jobs, t = [], 0.0
    for i, (g, d) in enumerate(drawn):
        t += rng.expovariate(rate)
        est = d * rng.uniform(0.9, 1.3) if rng.random() < EST_SHARE else None
        jobs.append(Job(id=f"j{i:04d}", gpus=g, tp=min(g, GPUS_PER_NODE) if g >= 8 else 1,
                        duration=d, submit=t, priority=1 if rng.random() < HIGH_SHARE else 0,
                        owner=f"u{rng.randrange(USERS)}", seq=i, est=est, remaining=d))
    return jobs


_SPECS: dict[tuple[int, int], JobSpec] = {}


def spec(tp: int, dp: int) -> JobSpec:
    if (tp, dp) not in _SPECS:
        _SPECS[(tp, dp)] = parse_spec({
            "name": "sim", "parallelism": {"tp": tp, "dp_replicate": dp},
            "resources": {"device": "cuda"}, "model": {"n_heads": 32, "d_model": 4096}})
    return _SPECS[(tp, dp)]


def planner(job: QueuedJob, snap: ClusterSnapshot) -> GangPlan | Pending:
    tp, dp = job.shape  # type: ignore[misc]
    return plan_job(spec(tp, dp), snap)


def finest_fit(snap: ClusterSnapshot, gpus: int, tp: int) -> int:
    """Index in LEVELS of the finest domain whose free GPUs hold the job (whole TP groups)."""
    free: dict[tuple[str, ...], int] = {}
    for n in snap.cluster.nodes:
        usable = len(n.free_gpus) // tp * tp
        path = snap.cluster.path(n)  # (spine, leaf)
        for key in (("node", n.name), ("leaf", *path), ("spine", path[0]), ("cluster",)):
            free[key] = free.get(key, 0) + usable
    for i, level in enumerate(LEVELS):
        if any(k[0] == level and v >= gpus for k, v in free.items()):
            return i
    return len(LEVELS)


def simulate(jobs_in: list[Job], policy: Policy) -> dict[str, Any]:
    base = cluster()
    jobs = {j.id: Job(**{k: v for k, v in vars(j).items() if k != "gpus_by_node"})
            for j in jobs_in}
    busy: dict[str, set[int]] = {n.name: set() for n in base.nodes}
    events: list[tuple[float, int, str, str, int]] = []  # (time, order, kind, job, gen)
    for j in jobs.values():
        heapq.heappush(events, (_grid(j.submit), 0, "arrive", j.id, 0))
    queue: dict[str, Job] = {}
    running: dict[str, Job] = {}
    busy_gpu_s = 0.0
    window = max(j.submit for j in jobs.values())
    crossings = placements = calls = preemptions = 0
    last_t = 0.0
    settings = PassSettings(grace_s=GRACE_S, min_run_s=MIN_RUN_S)
    horizon = window + 10 * CAP_S

    def account(t: float) -> None:
        nonlocal busy_gpu_s, last_t
        lo, hi = min(last_t, window), min(t, window)
        if hi > lo:
            busy_gpu_s += (hi - lo) * sum(len(v) for v in busy.values())
        last_t = t

    def free(j: Job) -> None:
        for n, gs in j.gpus_by_node.items():
            busy[n].difference_update(gs)
        j.gpus_by_node = {}

    while events:
        t = events[0][0]
        if t > horizon:
            break
        account(t)
        while events and events[0][0] <= t:  # everything due by t, then one pass
            _, _, kind, jid, gen = heapq.heappop(events)
            j = jobs[jid]
            if kind == "arrive":
                queue[jid] = j
            elif kind == "end" and gen == j.end_event and jid in running:
                j.ran += t - j.started  # type: ignore[operator]
                j.finish, j.remaining = t, 0.0
                free(j)
                del running[jid]
            elif kind == "stop" and jid in running and j.stopping_at == t:
                done = t - j.started  # type: ignore[operator]
                kept = math.floor(done / CKPT_S) * CKPT_S  # last checkpoint of this attempt
                j.ran += done
                j.lost += done - kept
                j.remaining -= kept
                j.started, j.stopping_at = None, None
                j.end_event += 1  # its old end no longer happens
                free(j)
                del running[jid]
                queue[jid] = j
        # the scheduling pass (every event time is on the GRID_S grid)
        snap = ClusterSnapshot(cluster=base.with_busy(busy), ray_nodes=())
        now = t
        if policy == Policy.FIFO:
            ordered = sorted(queue.values(), key=lambda j: (-j.priority, j.seq))
        else:
            aging = policy in (Policy.RESERVE, Policy.RESERVE_PREEMPT)
            held: dict[str, Usage] = {}
            for r in running.values():
                held[r.owner] = held.get(r.owner, Usage()) + Usage(gpus=r.gpus)
            prio = {j.id: effective_priority(j.priority, waited_s=now - j.submit) if aging
                    else j.priority for j in queue.values()}
            order = fair_order([Queued(j.id, j.owner, prio[j.id], j.seq, Usage(gpus=j.gpus))
                                for j in queue.values()], held=held,
                               total=Usage(gpus=NODES * GPUS_PER_NODE))
            ordered = [queue[q.id] for q in order]
        qjobs = [QueuedJob(id=j.id, priority=j.priority, submitted_at=j.submit, gpus=j.gpus,
                           est_runtime_s=None if j.est is None else
                           j.est * j.remaining / j.duration,
                           owner=j.owner, seq=j.seq, shape=(j.tp, j.gpus // j.tp))
                 for j in ordered]
        rjobs = []
        for r in running.values():
            assert r.started is not None
            est_end = r.stopping_at if r.stopping_at is not None else (
                None if r.est is None else r.started + r.est * r.remaining / r.duration)
            ckpt = r.started + math.floor((now - r.started) / CKPT_S) * CKPT_S
            rjobs.append(RunningJob(id=r.id, priority=r.priority, gpus_by_node=r.gpus_by_node,
                                    started_at=r.started, est_end=est_end,
                                    last_checkpoint_at=ckpt,
                                    preemptible=r.stopping_at is None))
        out = schedule_pass(qjobs, snap, rjobs, now=now, plan=planner, policy=policy,
                            settings=settings)
        calls += out.planner_calls
        for q, plan in out.placed:
            j = queue.pop(q.id)
            shown = finest_fit(snap, j.gpus, j.tp)
            level = plan.placement.level if plan.placement is not None else "cluster"
            crossings += LEVELS.index(level) > shown
            placements += 1
            snap = snap.reserve(gpus=plan.gpus_by_node(), cpus={})
            j.gpus_by_node = {n: tuple(g) for n, g in plan.gpus_by_node().items()}
            for n, gs in j.gpus_by_node.items():
                busy[n].update(gs)
            j.started = now
            if j.first_start is None:
                j.first_start = now
            running[j.id] = j
            j.end_event += 1
            heapq.heappush(events, (_grid(now + j.remaining), 1, "end", j.id, j.end_event))
        if out.preemption is not None:
            for v in out.preemption.victims:
                r = running[v]
                r.stopping_at = _grid(now + GRACE_S)
                r.preempted += 1
                preemptions += 1
                heapq.heappush(events, (r.stopping_at, 1, "stop", v, 0))
    end = last_t
    lost_gpu_s = sum(j.gpus * j.lost for j in jobs.values())
    return summarise(jobs, policy=policy, window=window, busy_gpu_s=busy_gpu_s,
                     lost_gpu_s=lost_gpu_s, crossings=crossings, placements=placements,
                     calls=calls, preemptions=preemptions, end=end)


def _grid(t: float) -> float:
    return math.ceil(t / GRID_S) * GRID_S


def _p99(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


def summarise(jobs: dict[str, Job], *, policy: Policy, window: float, busy_gpu_s: float,
              lost_gpu_s: float, crossings: int, placements: int, calls: int,
              preemptions: int, end: float) -> dict[str, Any]:
    capacity = NODES * GPUS_PER_NODE * window
    by_class: dict[str, Any] = {}
    for name, lo, hi in CLASSES:
        members = [j for j in jobs.values() if lo <= j.gpus <= hi]
        done = [j for j in members if j.finish is not None]
        jct = [(j.finish - j.submit) / 3600 for j in done]  # type: ignore[operator]
        waits = [((j.finish if j.finish is not None else end) - j.submit - j.ran) / 3600
                 for j in members]
        by_class[name] = {"jobs": len(members), "finished": len(done),
                          "jct_mean_h": statistics.fmean(jct) if jct else None,
                          "jct_p99_h": _p99(jct) if jct else None,
                          "wait_max_h": max(waits, default=0.0)}
    return {"policy": policy.value, "by_class": by_class,
            "largest_class_wait_max_h": by_class[CLASSES[-1][0]]["wait_max_h"],
            "gpu_utilisation": busy_gpu_s / capacity,
            "useful_utilisation": (busy_gpu_s - min(lost_gpu_s, busy_gpu_s)) / capacity,
            "preemptions": preemptions, "lost_gpu_h": lost_gpu_s / 3600,
            "unneeded_switch_crossings": crossings, "placements": placements,
            "planner_calls": calls, "sim_end_h": end / 3600}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "schedule_sim.json")
    args = ap.parse_args()
    jobs = trace(args.jobs, args.seed)
    results, cpu = {}, {}
    for policy in Policy:
        t0 = time.process_time()
        results[policy.value] = simulate(jobs, policy)
        cpu[policy.value] = time.process_time() - t0
        r = results[policy.value]
        print(f"{policy.value:16s} util {r['gpu_utilisation']:.3f} "
              f"wait64 {r['largest_class_wait_max_h']:.1f} h  cpu {cpu[policy.value]:.1f} s",
              flush=True)
    peer = results[Policy.SKIP.value]
    for r in results.values():
        r["vs_skip"] = {
            "gpu_utilisation": r["gpu_utilisation"] / peer["gpu_utilisation"],
            "largest_class_wait_max": r["largest_class_wait_max_h"]
            / max(peer["largest_class_wait_max_h"], 1e-9),
            "jct_mean_by_class": {c: (r["by_class"][c]["jct_mean_h"] or math.nan)
                                  / (peer["by_class"][c]["jct_mean_h"] or math.nan)
                                  for c in r["by_class"]}}
    out = {"trace": {"jobs": len(jobs), "seed": args.seed, "load": LOAD,
                     "arrival_window_h": max(j.submit for j in jobs) / 3600,
                     "cluster": f"{NODES} nodes x {GPUS_PER_NODE} GPUs, {NODES_PER_LEAF} nodes "
                                f"per leaf, {LEAVES_PER_SPINE} leaves per spine",
                     "sizes": dict(SIZES), "jobs_by_size": {
                         str(g): sum(1 for j in jobs if j.gpus == g) for g, _ in SIZES}},
           "cpu_s": cpu, "policies": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
