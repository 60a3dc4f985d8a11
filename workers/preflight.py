"""The pre-flight check, in every rank before step 1 (spec `preflight`, on by default).

On the placed gang's own process groups: an all-reduce of `size_mib` per group of every mesh
dimension with more than one rank (and the world), then a p2p ring (each rank sends to r+1
and receives from r-1; a send that starts late shows up on its receiver). Each test runs once
to warm up, then `repeats` times; the best time counts. The ranks gather every rank's
timings and run the same pure verdict (orchestrator/preflight.py), so all of them pass or all
raise `PreflightFailed` naming the slow link and its culprit ranks; the controller names their
nodes and the node health ledger cordons them before the gang is placed again.

Cost on the default CPU job (2 ranks, gloo on one node, 1 MiB): see bench/README.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.preflight import failure_message, slow_links
from orchestrator.spec import Preflight
from workers.faults import FaultInjector

_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


class PreflightFailed(RuntimeError):
    """A link of the placement is far slower than its peers (the message names it)."""


def _groups(mesh: Any) -> dict[str, Any]:
    """{"dim:r0,r1,...": group} for every mesh dimension with more than one rank, and the
    world; a dimension whose group is the world is tested once."""
    world = dist.get_world_size()
    out = {f"world:{','.join(map(str, range(world)))}": None}
    for dim in _DIMS:
        if mesh is None or dim not in (mesh.mesh_dim_names or ()) or mesh[dim].size() < 2:
            continue
        group = mesh[dim].get_group()
        ranks = dist.get_process_group_ranks(group)
        if len(ranks) == world:
            continue
        out[f"{dim}:{','.join(map(str, ranks))}"] = group
    return out


def _time_all_reduce(buf: torch.Tensor, group: Any, repeats: int) -> float:
    dist.all_reduce(buf, group=group)  # warm-up: connections, buffers
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        best = min(best, time.perf_counter() - t0)
    return best


def _time_ring(buf: torch.Tensor, out: torch.Tensor, *, rank: int, world: int,
               repeats: int, faults: FaultInjector, group: Any) -> float:
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    best = float("inf")
    for i in range(repeats + 1):
        dist.barrier(group=group)
        faults.before_send()
        t0 = time.perf_counter()
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, nxt, group=group),
                                        dist.P2POp(dist.irecv, out, prev, group=group)])
        works[1].wait()
        took = time.perf_counter() - t0
        works[0].wait()
        if i:  # the first run warms up
            best = min(best, took)
    return best


def run_preflight(cfg: Preflight, *, mesh: Any, rank: int, device: torch.device,
                  faults: FaultInjector) -> dict[str, Any]:
    """Runs the check on this rank; returns the summary (every rank the same verdict) or
    raises PreflightFailed."""
    world = dist.get_world_size()
    t0 = time.perf_counter()
    numel = max(1, int(cfg.size_mib * 1024 * 1024 // 4))
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    out = torch.empty_like(buf)
    timings: dict[str, Any] = {"rank": rank, "bytes": numel * 4, "groups": {}}
    for key, group in _groups(mesh).items():
        timings["groups"][key] = _time_all_reduce(buf, group, cfg.repeats)
    # The ring runs on a group of its own: send/recv counted in the default group's
    # Flight Recorder status would skew the watchdog's view of the training's collectives.
    ring = dist.new_group(ranks=list(range(world)))
    try:
        timings["p2p"] = {"src": (rank - 1) % world,
                          "s": _time_ring(buf, out, rank=rank, world=world,
                                          repeats=cfg.repeats, faults=faults, group=ring)}
    finally:
        dist.destroy_process_group(ring)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, timings)
    took = time.perf_counter() - t0
    slow = slow_links([g for g in gathered if isinstance(g, Mapping)], min_ratio=cfg.min_ratio)
    if slow:
        raise PreflightFailed(failure_message(slow))
    if took > cfg.timeout_s:
        raise PreflightFailed(f"pre-flight check failed: it took {took:.1f} s "
                              f"(preflight.timeout_s {cfg.timeout_s:g}); culprit ranks []")
    return {"seconds": round(took, 4), "tests": len(timings["groups"]) + 1,
            "bytes": numel * 4}
