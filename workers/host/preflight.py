"""The pre-flight check, in every rank before step 1 (spec `preflight`, on by default).

On the placed gang's own process groups: an all-reduce of `size_mib` per group of every mesh
dimension with more than one rank (and the world), then a p2p ring (each rank sends to r+1
and receives from r-1; a send that starts late shows up on its receiver). Each test runs once
to warm up, then `repeats` times; the best time counts (on CUDA after a device synchronise:
NCCL calls return once enqueued). Each rank adds the figures the controller expects of its
groups and of the pair into it (`RankAssignment.preflight_links`). The ranks gather every
rank's timings and run the same pure verdict (orchestrator/preflight/verdict.py), so all of them
pass or all raise `PreflightFailed` naming the slow link (class, nodes, measured and expected GB/s)
and its culprit ranks; the controller names their nodes and the node health ledger cordons
them before the gang is placed again.

The built-in loop calls `run_preflight` on its own process groups; a user-code rank's process
runs `check_pickled` before it becomes the rank (meshyard/_prestart.py, workers/usercode/rank.py).

Cost on the default CPU job (2 ranks, gloo on one node, 1 MiB): see bench/README.md.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.mesh import DIMS, MeshShape
from orchestrator.preflight.verdict import (
    ExpectedLink,
    failure_message,
    group_key,
    min_excess_for,
    min_excess_vs_figure_for,
    slow_links,
)
from orchestrator.spec import Preflight
from workers.host.assignment import RankAssignment
from workers.host.faults import FaultInjector


class PreflightFailed(RuntimeError):
    """A link of the placement is far slower than its peers (the message names it)."""


def _groups(mesh: Any) -> dict[str, Any]:
    """{"dim:r0,r1,...": group} for every mesh dimension with more than one rank, and the
    world; a dimension whose group is the world is tested once."""
    world = dist.get_world_size()
    out = {group_key("world", range(world)): None}
    for dim in DIMS:
        if mesh is None or dim not in (mesh.mesh_dim_names or ()) or mesh[dim].size() < 2:
            continue
        group = mesh[dim].get_group()
        ranks = dist.get_process_group_ranks(group)
        if len(ranks) == world:
            continue
        out[group_key(dim, ranks)] = group
    return out


def _done(buf: torch.Tensor) -> None:
    if buf.is_cuda:
        torch.cuda.synchronize(buf.device)


def _time_all_reduce(buf: torch.Tensor, group: Any, repeats: int) -> float:
    dist.all_reduce(buf, group=group)  # warm-up: connections, buffers
    _done(buf)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        _done(buf)
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
        _done(out)
        took = time.perf_counter() - t0
        works[0].wait()
        if i:  # the first run warms up
            best = min(best, took)
    return best


def run_preflight(cfg: Preflight, *, mesh: Any, rank: int, device: torch.device,
                  faults: FaultInjector,
                  expected: Mapping[str, Mapping[str, ExpectedLink]] | None = None
                  ) -> dict[str, Any]:
    """Runs the check on this rank; returns the summary (every rank the same verdict) or
    raises PreflightFailed. `expected`: per backend, this rank's groups' figures (the one of
    the backend it runs counts; none: the links are compared with each other only)."""
    backend = str(dist.get_backend())
    mine = (expected or {}).get(backend) or {}
    world = dist.get_world_size()
    t0 = time.perf_counter()
    numel = max(1, int(cfg.size_mib * 1024 * 1024 // 4))
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    out = torch.empty_like(buf)
    timings: dict[str, Any] = {"rank": rank, "bytes": numel * 4, "groups": {},
                               "expected": {k: v.to_dict() for k, v in mine.items()}}
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
    slow = slow_links([g for g in gathered if isinstance(g, Mapping)], min_ratio=cfg.min_ratio,
                      min_excess_s=min_excess_for(backend),
                      min_excess_vs_figure_s=min_excess_vs_figure_for(backend))
    if slow:
        raise PreflightFailed(failure_message(slow))
    if took > cfg.timeout_s:
        raise PreflightFailed(f"pre-flight check failed: it took {took:.1f} s "
                              f"(preflight.timeout_s {cfg.timeout_s:g}); culprit ranks []")
    return {"seconds": round(took, 4), "tests": len(timings["groups"]) + 1,
            "bytes": numel * 4}


# -- user-code ranks ----------------------------------------------------------------------------
def check_user_rank(a: RankAssignment) -> dict[str, Any]:
    """The check for a user-code rank, before the user's code runs: in the process that then
    becomes the rank (meshyard/_prestart.py, `check_pickled`; workers/usercode/rank.py).

    Its gang is the job's ranks on a rendezvous of its own (MASTER_ADDR and
    `a.preflight_port`, not MASTER_PORT, which the user's code uses), on the same device the
    rank's code gets (cuda:LOCAL_RANK among the node's job GPUs, else the CPU), with the mesh
    of the spec's parallelism. The user's code starts after the check's group is destroyed:
    it finds no process group and no module of meshyard's control plane (the same device's
    CUDA context, on a GPU rank, is the one its code would create).
    Returns {"ok": True, summary...} or {"ok": False, "message": the failure}.
    """
    from meshyard.parallel import backend_for, join_process_group
    from workers.host.env import select_device
    from workers.loop.mesh import build_mesh

    assert a.preflight_port, "a user-code pre-flight needs its own rendezvous port"
    device = select_device(a.spec, local_rank=a.dist.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    join_process_group(backend_for(device), a.dist.master_addr, a.preflight_port,
                       rank=a.rank, world_size=a.dist.world_size,
                       timeout=timedelta(seconds=a.spec.fault_tolerance.init_timeout_s))
    try:
        mesh = build_mesh(MeshShape.from_parallelism(a.spec.parallelism),
                          device_type=device.type)
        faults = FaultInjector.from_spec(a.spec, rank=a.rank, attempt=a.attempt)
        try:
            summary = run_preflight(a.spec.preflight, mesh=mesh, rank=a.rank, device=device,
                                    faults=faults, expected=a.preflight_links)
        except PreflightFailed as exc:
            return {"ok": False, "message": str(exc)}
        return {"ok": True, **summary}
    finally:
        dist.destroy_process_group()


def check_pickled(assignment: bytes) -> dict[str, Any]:
    """`check_user_rank` of a pickled RankAssignment, as the rank's own process runs it
    before it becomes the rank (meshyard/_prestart.py: the actor sends the pickle over the
    process's stdin pipe, so no file stands between them)."""
    a = pickle.loads(assignment)  # noqa: S301 - from this rank's actor, over a private pipe
    if not isinstance(a, RankAssignment):
        raise TypeError(f"expected a RankAssignment, got {type(a).__name__}")
    return check_user_rank(a)
