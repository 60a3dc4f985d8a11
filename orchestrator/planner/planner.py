"""Parallelism planner: enumerate (tp, pp, dp_shard, dp_replicate, ZeRO stage, microbatches,
activation checkpointing) for a model on a cluster's free GPUs and rank by estimated step time.

Pure module. The search space (configurations, with Llama 3's uneven end stages for
interleaving) is `plan_space.py`; the fit checks and the "fits nowhere" answer `plan_fit.py`.
Expert parallel (ep, for MoE models) and context parallel (cp, on GPUs, long sequences) are
searched as the workers run them (plan_space.py); the note on their choice is
plan_explain.py. Per configuration:

  memory      per GPU on the busiest pipeline stage, broken down as the workers hold it
              (memory.py: FSDP's unsharded gradients and parameters while sync is deferred
              to the last microbatch): must fit `usable` = GPU memory x (1 - reserve)
  compute     6 * N * tokens / (world * peak FLOP/s * efficiency), N the parameters a token
              uses (a MoE block's top_k experts, not all); x 4/3 with activation
              checkpointing (the forward runs again in backward: 8N instead of 6N)
  bubble      (p - 1) / (v*m + p - 1) of the pipelined step (v chunks per rank with
              interleaved 1F1B, else 1): step = compute / (1 - bubble)
  comm        the cost model's signature (cost.py) on the links the solver's layout gives each
              dimension; only the exposed part adds to the step time
  step        compute / (1 - bubble) + exposed comm

Links come from domain sizes, not from the full solver per candidate (a 2,048-node cluster
has thousands of candidates): ranks are laid out as the solver lays out a packed job —
consecutive ranks on one node, nodes in switch-tree order, local GPU index = rail — and each
dimension's first and last groups are costed on that layout (`LinkModel.group_link`). TP must
stay inside an NVLink domain (a node's NVLink island, or a multi-node NVLink domain); on a
cluster without NVLink the node is the domain. `solve_top` runs the real solver on the best
plans and reports its estimate next to the planner's. Memory rejections quote the nearest
misses; when nothing is feasible, `PlanResult.no_fit` says the least memory per GPU any
layout needs and how many GPUs would fit the model (`meshyard plan` and POST /v1/plans turn
it into an error). Interleaving options left out (more chunks than layers + 2) are named in
`PlanResult.notes`.

Worked example: 8 x H100 (80 GB, NVSwitch), a 1.3B model, 256 sequences of 2048: every plan
computes the same 6N tokens, so the winner has the least exposed communication; TP pays four
un-overlapped all-reduces per block and microbatch, FSDP hides 70% of its gathers, so the top
plan is pure data parallel (tp=1, pp=1, dp_shard=8, ZeRO-3).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.placement.cost import ModelDims, call_seconds, communication_signature
from orchestrator.placement.links import LinkFigures
from orchestrator.planner.memory import MemoryBreakdown, ModelShape
from orchestrator.planner.plan_explain import degree_notes
from orchestrator.planner.plan_fit import (
    NoFit,
    find_no_fit,
    memory_check,
    memory_config,
    precheck,
)
from orchestrator.planner.plan_layout import Layout, PlanningError, layout_for
from orchestrator.planner.plan_space import (
    Candidate,
    Hardware,
    PlanRequest,
    Rejection,
    candidates,
    skipped_virtual,
    virtual_options,
)
from orchestrator.topology.model import ClusterTopology

__all__ = ["Candidate", "Hardware", "NoFit", "Plan", "PlanRequest", "PlanResult", "PlanningError",
           "Rejection", "candidates", "evaluate", "layout_for", "memory_config", "plan",
           "virtual_options"]

@dataclass(frozen=True)
class Plan:
    config: Candidate
    micro_batch: int  # sequences per microbatch per rank
    memory: MemoryBreakdown
    compute_s: float
    bubble: float  # fraction of the pipelined step
    comm_total_s: float
    comm_exposed_s: float
    comm: tuple[dict[str, Any], ...]
    step_s: float
    tokens_per_s: float
    notes: tuple[str, ...] = ()
    solver: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config.as_dict(), "label": self.config.label(),
                "micro_batch": self.micro_batch, "memory": self.memory.as_dict(),
                "compute_s": self.compute_s, "bubble": self.bubble,
                "bubble_s": self.step_s - self.comm_exposed_s - self.compute_s,
                "comm_total_s": self.comm_total_s, "comm_exposed_s": self.comm_exposed_s,
                "comm": list(self.comm), "step_s": self.step_s,
                "tokens_per_s": self.tokens_per_s, "notes": list(self.notes),
                "solver": self.solver}


@dataclass(frozen=True)
class PlanResult:
    plans: tuple[Plan, ...]  # best first, at most top_k
    rejected: tuple[Rejection, ...]  # a few examples per reason
    rejected_counts: dict[str, int]
    considered: int
    feasible: int
    elapsed_s: float
    world_size: int
    tp_domain: int
    notes: tuple[str, ...] = ()
    no_fit: NoFit | None = None  # set when nothing is feasible: why, and what would fit

    def as_dict(self) -> dict[str, Any]:
        return {"plans": [p.as_dict() for p in self.plans],
                "rejected": [r.as_dict() for r in self.rejected],
                "rejected_counts": dict(self.rejected_counts), "considered": self.considered,
                "feasible": self.feasible, "elapsed_s": self.elapsed_s,
                "world_size": self.world_size, "tp_domain": self.tp_domain,
                "notes": list(self.notes),
                "no_fit": None if self.no_fit is None else self.no_fit.as_dict()}


# -- evaluation ------------------------------------------------------------------------------


def _dims(model: ModelShape, c: Candidate, *, local: int, precision: str) -> ModelDims:
    elt = 2 if precision == "bf16-mixed" else 4
    pipelined = c.pp > 1
    return ModelDims(n_layers=model.n_layers, d_model=model.d_model, ffn_dim=model.ffn,
                     vocab_size=model.vocab_size, seq_len=model.seq_len,
                     micro_batch_size=local if pipelined else local // c.microbatches,
                     pp_microbatches=c.microbatches if pipelined else 1,
                     grad_accum_steps=1 if pipelined else c.microbatches,
                     act_bytes=elt, param_bytes=elt, sequence_parallel=c.tp > 1,
                     zero_stage=c.zero_stage, moe_experts=model.experts,
                     moe_top_k=model.top_k, moe_capacity_factor=model.capacity_factor)


def _comm(layout: Layout, c: Candidate, dims: ModelDims
          ) -> tuple[float, float, tuple[dict[str, Any], ...]]:
    total = exposed = 0.0
    rows_out = []
    by_dim: dict[str, list[Any]] = {}
    for row in communication_signature(c.mesh, dims):
        by_dim.setdefault(row.dimension, []).append(row)
    for dim, rows in by_dim.items():
        link = layout.dimension_link(c.mesh, dim)
        if link is None:
            continue
        t = e = 0.0
        for r in rows:
            chunks = c.virtual_stages if dim == "pp" else 1  # each chunk boundary is a hop
            one = chunks * r.calls_per_step * call_seconds(r.primitive, n=r.participants,
                                                  nbytes=r.bytes_per_call, link=link)
            t += one
            e += one * (1 - r.overlap)
        total += t
        exposed += e
        rows_out.append({"dimension": dim, "seconds": t, "exposed_seconds": e,
                         "link": link.kind, "gbs": link.gbs})
    return total, exposed, tuple(rows_out)


def evaluate(c: Candidate, *, req: PlanRequest, layout: Layout) -> Plan | Rejection:
    model, hw = req.model, req.hardware
    local = req.global_batch // c.data_shards
    stages = c.pp * c.virtual_stages
    if (rej := precheck(c, req=req)) is not None:
        return rej
    mem = memory_check(c, req=req)
    if isinstance(mem, Rejection):
        return mem
    world = c.mesh.world_size
    tokens = req.global_batch * model.seq_len
    flops = (8 if c.activation_checkpointing else 6) * model.active_params * tokens
    compute = flops / (world * hw.peak_tflops * 1e12 * hw.efficiency)
    # interleaving v chunks per rank shrinks the bubble v-fold (Narayanan et al. 2021)
    bubble = (c.pp - 1) / (c.virtual_stages * c.microbatches + c.pp - 1) if c.pp > 1 else 0.0
    total, exposed, rows = _comm(layout, c, _dims(model, c, local=local,
                                                  precision=hw.precision))
    step = compute / (1 - bubble) + exposed
    notes: tuple[str, ...] = ()
    if c.ends_as_layers:
        notes = (f"{model.n_layers} layers over {stages} stages, the first and last holding "
                 "one layer fewer (the embedding and the head in its place)",)
    elif model.n_layers % stages:
        notes = (f"uneven stages: {model.n_layers} layers over {stages} stages",)
    return Plan(config=c, micro_batch=local // c.microbatches, memory=mem, compute_s=compute,
                bubble=bubble, comm_total_s=total, comm_exposed_s=exposed, comm=rows,
                step_s=step, tokens_per_s=tokens / step, notes=notes)


def _rank_key(p: Plan) -> tuple[float, ...]:
    # Equal step times (to 0.1%) go to the simpler plan: fewer dimensions, less sharding.
    c = p.config
    return (round(p.step_s, 12) if p.step_s == 0 else round(math.log(p.step_s) * 1000),
            c.tp * c.pp * c.ep * c.cp, c.zero_stage, int(c.activation_checkpointing),
            c.virtual_stages,
            c.microbatches, p.memory.total)


def plan(cluster: ClusterTopology, req: PlanRequest, *,
         figures: LinkFigures | None = None) -> PlanResult:
    """Ranked plans for `req` on the free GPUs of `cluster` (see module doc)."""
    start = time.perf_counter()
    if req.global_batch < 1:
        raise PlanningError("global_batch must be >= 1 sequence")
    layout = layout_for(cluster, gpus=req.gpus, figures=figures)
    world = len(layout.slots)
    plans: list[Plan] = []
    rejected: list[Rejection] = []
    misses: list[Rejection] = []  # memory rejections: the nearest misses are quoted
    counts: Counter[str] = Counter()
    by_degree: dict[tuple[str, int], Counter[str]] = {}  # (ep|cp, degree) -> reasons
    considered = 0
    for item in candidates(req.model, world=world, global_batch=req.global_batch,
                           max_tp=layout.tp_domain, context_parallel=req.context_parallel):
        considered += 1
        out = item if isinstance(item, Rejection) else evaluate(item, req=req, layout=layout)
        if isinstance(out, Rejection):
            counts[out.reason] += 1
            for dim in ("ep", "cp"):
                by_degree.setdefault((dim, getattr(out.config, dim)), Counter())[out.reason] += 1
            if out.reason == "memory":
                misses.append(out)
            elif counts[out.reason] <= 3:
                rejected.append(out)
        else:
            plans.append(out)
    plans.sort(key=_rank_key)
    rejected += sorted(misses, key=lambda r: r.need_bytes or 0.0)[:3]
    top = tuple(plans[:req.top_k])
    if req.solve_top:
        top = tuple(_with_solver(cluster, p, req=req, figures=figures) if i < req.solve_top
                    else p for i, p in enumerate(top))
    no_fit = None if plans else find_no_fit(
        req, world=world, max_tp=layout.tp_domain, node_gpus=layout.node_gpus,
        memory_misses=misses, reasons=dict(counts))
    return PlanResult(plans=top, rejected=tuple(rejected), rejected_counts=dict(counts),
                      considered=considered, feasible=len(plans),
                      elapsed_s=time.perf_counter() - start, world_size=world,
                      tp_domain=layout.tp_domain,
                      notes=(*layout.notes, *_skipped(req, world),
                             *degree_notes(req, world, plans, by_degree)),
                      no_fit=no_fit)


def _skipped(req: PlanRequest, world: int) -> list[str]:
    """Notes on interleaving options the enumeration left out, one per pipeline degree."""
    pps = [pp for pp in range(2, min(world, req.model.n_layers) + 1) if world % pp == 0]
    return [n for pp in pps if (n := skipped_virtual(req.model, pp))]


def _with_solver(cluster: ClusterTopology, p: Plan, *, req: PlanRequest,
                 figures: LinkFigures | None) -> Plan:
    """The real solver's placement estimate for plan `p` (the planner's layout is its guess)."""
    from orchestrator.placement.solver import Constraints, solve
    from orchestrator.spec import ConstraintMode

    local = req.global_batch // p.config.data_shards
    dims = _dims(req.model, p.config, local=local, precision=req.hardware.precision)
    out = solve(cluster, p.config.mesh, constraints=Constraints(mode=ConstraintMode.PREFERRED),
                model=dims, figures=figures)
    est = getattr(out, "estimate", None)
    if est is None:
        return replace(p, solver={"error": str(getattr(out, "message", out))})
    return replace(p, solver={"total_s": est.total_s, "exposed_s": est.exposed_s,
                              "level": getattr(out, "level", None)})
