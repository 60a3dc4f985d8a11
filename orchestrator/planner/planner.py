"""Parallelism planner: enumerate (tp, pp, dp_shard, dp_replicate, ZeRO stage, microbatches,
activation checkpointing) for a model on a cluster's free GPUs and rank by estimated step time.

Pure module. Per configuration:

  memory      per GPU, broken down (memory.py): must fit `usable` = GPU memory x (1 - reserve)
  compute     6 * N * tokens / (world * peak FLOP/s * efficiency); x 4/3 with activation
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
plans and reports its estimate next to the planner's.

Worked example: 8 x H100 (80 GB, NVSwitch), a 1.3B model, 256 sequences of 2048: every plan
computes the same 6N tokens, so the winner has the least exposed communication; TP pays four
un-overlapped all-reduces per block and microbatch, FSDP hides 70% of its gathers, so the top
plan is pure data parallel (tp=1, pp=1, dp_shard=8, ZeRO-3).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.limits import divisors
from orchestrator.mesh import MeshShape
from orchestrator.placement.cost import ModelDims, call_seconds, communication_signature
from orchestrator.placement.links import LinkFigures
from orchestrator.planner.memory import MemoryBreakdown, MemoryConfig, ModelShape, memory_per_gpu
from orchestrator.planner.plan_layout import Layout, PlanningError, layout_for
from orchestrator.topology.model import ClusterTopology

_MAX_MICROBATCH_OPTIONS = 5


@dataclass(frozen=True)
class Hardware:
    """Per-GPU figures. Defaults: H100 SXM, dense bf16 989 TFLOP/s at 40% model FLOPs use."""

    memory_gb: float = 80.0
    peak_tflops: float = 989.0
    efficiency: float = 0.4
    reserve: float = 0.1  # allocator fragmentation, CUDA context, NCCL buffers
    precision: str = "bf16-mixed"

    @property
    def usable_bytes(self) -> float:
        return self.memory_gb * 1e9 * (1 - self.reserve)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PlanRequest:
    model: ModelShape
    global_batch: int  # sequences per optimizer step
    gpus: int | None = None  # None: every free GPU
    hardware: Hardware = field(default_factory=Hardware)
    even_stages: bool = False  # pp must divide n_layers (the workers' pipeline needs it)
    worker_layouts: bool = False  # only layouts meshyard's workers run (see _worker_issue)
    schedule: str = "1f1b"
    top_k: int = 10
    solve_top: int = 0  # run the full solver on this many of the best plans


@dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    dp_shard: int
    dp_replicate: int
    zero_stage: int
    microbatches: int
    activation_checkpointing: bool
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B when > 1)

    @property
    def schedule(self) -> str:
        return "interleaved_1f1b" if self.virtual_stages > 1 else "1f1b"

    @property
    def mesh(self) -> MeshShape:
        return MeshShape(pp=self.pp, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard,
                         tp=self.tp)

    @property
    def dp(self) -> int:
        return self.dp_shard * self.dp_replicate

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def label(self) -> str:
        ac = " ac" if self.activation_checkpointing else ""
        v = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        return (f"tp{self.tp} pp{self.pp} dps{self.dp_shard} dpr{self.dp_replicate} "
                f"z{self.zero_stage} m{self.microbatches}{v}{ac}")


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
class Rejection:
    config: Candidate
    reason: str  # memory | tp_domain | heads | layers | batch
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config.as_dict(), "label": self.config.label(),
                "reason": self.reason, "message": self.message}


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

    def as_dict(self) -> dict[str, Any]:
        return {"plans": [p.as_dict() for p in self.plans],
                "rejected": [r.as_dict() for r in self.rejected],
                "rejected_counts": dict(self.rejected_counts), "considered": self.considered,
                "feasible": self.feasible, "elapsed_s": self.elapsed_s,
                "world_size": self.world_size, "tp_domain": self.tp_domain,
                "notes": list(self.notes)}


# -- enumeration -----------------------------------------------------------------------------


def _pow2divisors(n: int) -> list[int]:
    return [d for d in divisors(n) if d & (d - 1) == 0]


def _dp_splits(dp: int) -> list[tuple[int, int]]:
    """(dp_shard, dp_replicate): pure FSDP, pure DDP, and HSDP with power-of-two shards."""
    shards = sorted({1, dp, *(d for d in _pow2divisors(dp) if d < dp)})
    return [(s, dp // s) for s in shards]


def _virtual_options(model: ModelShape, pp: int) -> list[int]:
    """Chunks per pipeline rank: 1, and for interleaved 1F1B 2, 4, 8 while each chunk keeps
    at least one block."""
    if pp == 1:
        return [1]
    return [v for v in (1, 2, 4, 8) if v * pp <= model.n_layers]


def _microbatch_options(local_batch: int, pp: int) -> list[int]:
    opts = [m for m in divisors(local_batch) if m >= pp or pp == 1]
    if len(opts) <= _MAX_MICROBATCH_OPTIONS:
        return opts
    # few, spread from the least to the most microbatches (the most: the smallest bubble)
    step = (len(opts) - 1) / (_MAX_MICROBATCH_OPTIONS - 1)
    return sorted({opts[round(i * step)] for i in range(_MAX_MICROBATCH_OPTIONS)})


def candidates(model: ModelShape, *, world: int, global_batch: int, max_tp: int
               ) -> Iterator[Candidate | Rejection]:
    """Every configuration of `world` GPUs, or the reason a whole family is impossible."""
    for tp in divisors(world):
        if tp > 1 and tp & (tp - 1):
            continue  # TP degrees are powers of two in practice (heads, hidden sizes)
        base = Candidate(tp, 1, 1, world // tp, 0, 1, False)
        if model.n_heads % tp or model.ffn % tp:
            yield Rejection(base, "heads", f"tp={tp} does not divide n_heads={model.n_heads} "
                            f"and the MLP size {model.ffn}")
            continue
        if tp > max_tp:
            yield Rejection(base, "tp_domain", f"tp={tp} crosses NVLink domains (largest "
                            f"domain on the free GPUs: {max_tp})")
            continue
        for pp in divisors(world // tp):
            if pp > model.n_layers:
                break
            dp = world // tp // pp
            yield from _family(model, tp=tp, pp=pp, dp=dp, global_batch=global_batch)


def _family(model: ModelShape, *, tp: int, pp: int, dp: int,
            global_batch: int) -> Iterator[Candidate | Rejection]:
    if global_batch % dp:
        yield Rejection(Candidate(tp, pp, dp, 1, 0, 1, False), "batch",
                        f"global batch {global_batch} is not divisible by dp={dp}")
        return
    local = global_batch // dp
    for dp_shard, dp_rep in _dp_splits(dp):
        for zero in ((1, 2, 3) if dp_shard > 1 else (0,)):
            for m in _microbatch_options(local, pp):
                for v in _virtual_options(model, pp):
                    for ac in (False, True):
                        yield Candidate(tp, pp, dp_shard, dp_rep, zero, m, ac, v)


# -- evaluation ------------------------------------------------------------------------------


def _memory(model: ModelShape, c: Candidate, *, local: int, req: PlanRequest
            ) -> MemoryBreakdown:
    return memory_per_gpu(model, MemoryConfig(
        tp=c.tp, pp=c.pp, dp_shard=c.dp_shard, zero_stage=c.zero_stage,
        micro_batch=local // c.microbatches, microbatches=c.microbatches,
        activation_checkpointing=c.activation_checkpointing, sequence_parallel=c.tp > 1,
        schedule=req.schedule, virtual_stages=c.virtual_stages,
        precision=req.hardware.precision))


def _dims(model: ModelShape, c: Candidate, *, local: int, precision: str) -> ModelDims:
    elt = 2 if precision == "bf16-mixed" else 4
    pipelined = c.pp > 1
    return ModelDims(n_layers=model.n_layers, d_model=model.d_model, ffn_dim=model.ffn,
                     vocab_size=model.vocab_size, seq_len=model.seq_len,
                     micro_batch_size=local if pipelined else local // c.microbatches,
                     pp_microbatches=c.microbatches if pipelined else 1,
                     grad_accum_steps=1 if pipelined else c.microbatches,
                     act_bytes=elt, param_bytes=elt, sequence_parallel=c.tp > 1,
                     zero_stage=c.zero_stage)


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


def _worker_issue(c: Candidate) -> str | None:
    """Layouts workers/parallelize.py and workers/pipeline.py refuse: DDP or ZeRO-1 (not
    FSDP) together with TP, and ZeRO-1 together with PP."""
    if c.dp == 1 or c.zero_stage >= 2:
        return None
    if c.tp > 1:
        return (f"the workers run DDP / ZeRO-1 only without TP (tp={c.tp}); shard data "
                "parallelism (dp_shard, ZeRO-2/3) instead")
    if c.zero_stage == 1 and c.pp > 1:
        return "the workers do not run ZeRO-1 with pipeline parallelism"
    return None


def evaluate(c: Candidate, *, req: PlanRequest, layout: Layout) -> Plan | Rejection:
    model, hw = req.model, req.hardware
    local = req.global_batch // c.dp
    stages = c.pp * c.virtual_stages
    if req.even_stages and model.n_layers % stages:
        return Rejection(c, "layers", f"pp={c.pp} x {c.virtual_stages} virtual stages does not "
                         f"divide n_layers={model.n_layers}")
    if req.worker_layouts and (issue := _worker_issue(c)):
        return Rejection(c, "workers", issue)
    mem = _memory(model, c, local=local, req=req)
    if mem.total > hw.usable_bytes:
        return Rejection(c, "memory", f"does not fit in memory: {mem.total / 1e9:.1f} GB per "
                         f"GPU > {hw.usable_bytes / 1e9:.1f} GB usable")
    world = c.mesh.world_size
    tokens = req.global_batch * model.seq_len
    flops = (8 if c.activation_checkpointing else 6) * model.total_params * tokens
    compute = flops / (world * hw.peak_tflops * 1e12 * hw.efficiency)
    # interleaving v chunks per rank shrinks the bubble v-fold (Narayanan et al. 2021)
    bubble = (c.pp - 1) / (c.virtual_stages * c.microbatches + c.pp - 1) if c.pp > 1 else 0.0
    total, exposed, rows = _comm(layout, c, _dims(model, c, local=local,
                                                  precision=hw.precision))
    step = compute / (1 - bubble) + exposed
    notes: tuple[str, ...] = ()
    if model.n_layers % stages:
        notes = (f"uneven stages: {model.n_layers} layers over {stages} stages",)
    return Plan(config=c, micro_batch=local // c.microbatches, memory=mem, compute_s=compute,
                bubble=bubble, comm_total_s=total, comm_exposed_s=exposed, comm=rows,
                step_s=step, tokens_per_s=tokens / step, notes=notes)


def _rank_key(p: Plan) -> tuple[float, ...]:
    # Equal step times (to 0.1%) go to the simpler plan: fewer dimensions, less sharding.
    c = p.config
    return (round(p.step_s, 12) if p.step_s == 0 else round(math.log(p.step_s) * 1000),
            c.tp * c.pp, c.zero_stage, int(c.activation_checkpointing), c.virtual_stages,
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
    counts: Counter[str] = Counter()
    considered = 0
    for item in candidates(req.model, world=world, global_batch=req.global_batch,
                           max_tp=layout.tp_domain):
        considered += 1
        out = item if isinstance(item, Rejection) else evaluate(item, req=req, layout=layout)
        if isinstance(out, Rejection):
            counts[out.reason] += 1
            if counts[out.reason] <= 3:
                rejected.append(out)
        else:
            plans.append(out)
    plans.sort(key=_rank_key)
    top = tuple(plans[:req.top_k])
    if req.solve_top:
        top = tuple(_with_solver(cluster, p, req=req, figures=figures) if i < req.solve_top
                    else p for i, p in enumerate(top))
    return PlanResult(plans=top, rejected=tuple(rejected), rejected_counts=dict(counts),
                      considered=considered, feasible=len(plans),
                      elapsed_s=time.perf_counter() - start, world_size=world,
                      tp_domain=layout.tp_domain, notes=layout.notes)


def _with_solver(cluster: ClusterTopology, p: Plan, *, req: PlanRequest,
                 figures: LinkFigures | None) -> Plan:
    """The real solver's placement estimate for plan `p` (the planner's layout is its guess)."""
    from orchestrator.placement.solver import Constraints, solve
    from orchestrator.spec import ConstraintMode

    local = req.global_batch // p.config.dp
    dims = _dims(req.model, p.config, local=local, precision=req.hardware.precision)
    out = solve(cluster, p.config.mesh, constraints=Constraints(mode=ConstraintMode.PREFERRED),
                model=dims, figures=figures)
    est = getattr(out, "estimate", None)
    if est is None:
        return replace(p, solver={"error": str(getattr(out, "message", out))})
    return replace(p, solver={"total_s": est.total_s, "exposed_s": est.exposed_s,
                              "level": getattr(out, "level", None)})
