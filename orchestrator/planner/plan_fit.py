"""Does a configuration fit, and when nothing does, what would. Pure module.

`precheck` and `memory_check` are the planner's first two gates (stage layout and the
workers' limits, then memory per GPU). `find_no_fit` explains an empty plan: the least memory
per GPU any layout of the request's GPUs needs (the nearest miss), and the fewest GPUs --
whole nodes like the request's, the same global batch and TP domain -- with a layout that
fits, found by doubling the GPU count and then bisecting over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from orchestrator.planner.memory import MemoryBreakdown, MemoryConfig, memory_per_gpu
from orchestrator.planner.plan_space import Candidate, PlanRequest, Rejection, candidates


def memory_config(c: Candidate, *, local: int, req: PlanRequest) -> MemoryConfig:
    """The memory model's view of candidate `c` (`local`: sequences per step per dp rank)."""
    return MemoryConfig(
        tp=c.tp, pp=c.pp, dp_shard=c.dp_shard, zero_stage=c.zero_stage,
        micro_batch=local // c.microbatches, microbatches=c.microbatches,
        activation_checkpointing=c.activation_checkpointing, sequence_parallel=c.tp > 1,
        schedule=req.schedule, virtual_stages=c.virtual_stages,
        precision=req.hardware.precision, ends_as_layers=c.ends_as_layers, ep=c.ep, cp=c.cp)


def _worker_issue(c: Candidate, *, moe: bool) -> str | None:
    """Layouts the workers refuse (workers/loop/parallelize.py): ZeRO-1 together with TP or PP,
    and a MoE model with TP or PP."""
    if moe and (c.tp > 1 or c.pp > 1):
        return (f"the workers run MoE models with ep, dp_shard and dp_replicate only, not with "
                f"tp={c.tp} / pp={c.pp}")
    if c.zero_stage == 1 and c.dp > 1 and (c.tp > 1 or c.pp > 1):
        return (f"the workers run ZeRO-1 only without TP and PP (tp={c.tp}, pp={c.pp}); use "
                "ZeRO-0, or shard data parallelism (dp_shard, ZeRO-2/3)")
    return None


def precheck(c: Candidate, *, req: PlanRequest) -> Rejection | None:
    """What rules `c` out before its memory is estimated (stage layout, the workers)."""
    stages = c.pp * c.virtual_stages
    if req.even_stages and (req.model.n_layers % stages or c.ends_as_layers):
        return Rejection(c, "layers", f"pp={c.pp} x {c.virtual_stages} virtual stages does not "
                         f"divide n_layers={req.model.n_layers} into equal stages")
    if req.worker_layouts and (issue := _worker_issue(c, moe=bool(req.model.experts))):
        return Rejection(c, "workers", issue)
    return None


def memory_check(c: Candidate, *, req: PlanRequest) -> MemoryBreakdown | Rejection:
    """The breakdown of `c`, or its memory rejection (with the bytes it needs)."""
    hw = req.hardware
    mem = memory_per_gpu(req.model, memory_config(c, local=req.global_batch // c.data_shards,
                                                  req=req))
    if mem.total > hw.usable_bytes:
        return Rejection(c, "memory", f"does not fit in memory: {mem.total / 1e9:.1f} GB per "
                         f"GPU > {hw.usable_bytes / 1e9:.1f} GB usable", need_bytes=mem.total)
    return mem


# Search for the GPU count that fits: doubling, then bisection over whole nodes.
_MAX_GROWTH = 1024


@dataclass(frozen=True)
class NoFit:
    """Why no configuration of `world_size` GPUs is feasible, and what would be.

    `least_bytes` / `nearest`: the least memory per GPU any layout needs and that layout
    (None when nothing failed on memory); `gpus_needed` / `fit`: the fewest GPUs, in whole
    nodes of `node_gpus`, with a layout that fits (None when none does up to `searched_to`).
    """

    world_size: int
    usable_bytes: float
    node_gpus: int
    global_batch: int
    reasons: dict[str, int]
    least_bytes: float | None = None
    nearest: Rejection | None = None
    gpus_needed: int | None = None
    fit: tuple[Candidate, float] | None = None
    searched_to: int = 0

    def message(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
        if self.least_bytes is None or self.nearest is None:
            return (f"no configuration of {self.world_size} GPUs is possible (rejected: "
                    f"{counts})")
        text = (f"the model fits no layout of {self.world_size} GPUs: the least memory any "
                f"layout needs is {self.least_bytes / 1e9:.1f} GB per GPU "
                f"({self.nearest.config.label()}) against {self.usable_bytes / 1e9:.1f} GB "
                "usable")
        if self.gpus_needed is not None and self.fit is not None:
            c, need = self.fit
            nodes = self.gpus_needed // self.node_gpus
            text += (f"; {self.gpus_needed} GPUs ({nodes} nodes of {self.node_gpus}) fit it "
                     f"({c.label()}, {need / 1e9:.1f} GB per GPU)")
        else:
            text += (f"; no layout fits on up to {self.searched_to} GPUs with a global batch "
                     f"of {self.global_batch} sequences")
        return text

    def as_dict(self) -> dict[str, Any]:
        fit = None if self.fit is None else {"label": self.fit[0].label(),
                                             "config": self.fit[0].as_dict(),
                                             "memory_gb": self.fit[1] / 1e9}
        return {"message": self.message(), "world_size": self.world_size,
                "usable_gb": self.usable_bytes / 1e9,
                "least_gb_per_gpu": None if self.least_bytes is None else self.least_bytes / 1e9,
                "nearest": None if self.nearest is None else self.nearest.as_dict(),
                "gpus_needed": self.gpus_needed, "fit": fit, "searched_to": self.searched_to,
                "rejected_counts": dict(self.reasons)}


def _fit_on(req: PlanRequest, world: int, max_tp: int) -> tuple[Candidate, float] | None:
    """The first configuration of `world` GPUs that passes the prechecks and fits."""
    for item in candidates(req.model, world=world, global_batch=req.global_batch,
                           max_tp=max_tp, context_parallel=req.context_parallel):
        if isinstance(item, Rejection) or precheck(item, req=req) is not None:
            continue
        mem = memory_check(item, req=req)
        if not isinstance(mem, Rejection):
            return item, mem.total
    return None


def find_no_fit(req: PlanRequest, *, world: int, max_tp: int, node_gpus: int,
                memory_misses: list[Rejection], reasons: dict[str, int]) -> NoFit:
    """Explain an empty plan for `world` GPUs (see module doc)."""
    base = NoFit(world_size=world, usable_bytes=req.hardware.usable_bytes,
                 node_gpus=node_gpus, global_batch=req.global_batch, reasons=dict(reasons))
    if not memory_misses:
        return base
    nearest = min(memory_misses, key=lambda r: r.need_bytes or float("inf"))
    nodes = max(1, -(-world // node_gpus))
    lo, hi, found = nodes, None, None
    k = nodes
    while k * node_gpus <= world * _MAX_GROWTH:
        k *= 2
        if (fit := _fit_on(req, k * node_gpus, max_tp)) is not None:
            hi, found = k, fit
            break
        lo = k
    searched = min(k, world * _MAX_GROWTH // node_gpus) * node_gpus
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if (fit := _fit_on(req, mid * node_gpus, max_tp)) is not None:
            hi, found = mid, fit
        else:
            lo = mid
    return replace(base, least_bytes=nearest.need_bytes, nearest=nearest,
                   gpus_needed=None if hi is None else hi * node_gpus, fit=found,
                   searched_to=searched)
