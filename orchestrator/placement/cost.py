"""Communication cost model: a job's communication signature and its alpha-beta time.

Pure module. Per parallel dimension (the way the Megatron, FSDP and DDP design notes describe
them), per optimizer step:

  tp            all-reduce of the activations, 2 in forward + 2 in backward per block and
                microbatch (with sequence parallelism: all-gather + reduce-scatter instead)
  dp_shard      FSDP / ZeRO-3: per block all-gather of parameters (forward and again in
                backward, per gradient-accumulation step) and one reduce-scatter of
                gradients per step (sync is deferred to the last microbatch); ZeRO-1/0:
                bucketed all-reduce
  dp_replicate  DDP / HSDP replicas: bucketed all-reduce of the (sharded) gradients
  pp            send/recv of activations forward and their gradients backward per microbatch
  ep            MoE expert parallel: all-to-all dispatch and combine of the routed tokens
                (top_k * capacity_factor per token) per MoE layer and microbatch, forward and
                backward; with dp_shard == 1 also FSDP over ep of the dense parameters. A
                rank's gradients and FSDP traffic count its experts / ep of each block
  cp            context parallel (ring attention): per attention layer and microbatch, cp - 1
                send/recv steps of the K and V shards forward, twice that backward (K/V and
                their gradients); with dp_shard == 1 also FSDP over cp of the parameters

Time of one call over n ranks whose bottleneck link has bandwidth B and latency a:
  ring all-reduce               2(n-1)/n * M/B + 2(n-1) a
  all-gather / reduce-scatter    (n-1)/n * M/B +  (n-1) a      (M = the full buffer)
  send/recv                             M/B +         a
  all-to-all                     (n-1)/n * M/B +  (n-1) a      (M = one rank's buffer)

A dimension's time is that of its slowest group (groups run concurrently); `total_s` sums the
dimensions, `exposed_s` discounts each by the fraction the framework overlaps with compute.

Example: tp=8 on one H100 node (NV18, 450 GB/s), 32 blocks, 4096 x 4096 bf16 activations
(32 MiB): 128 all-reduces of 2*7/8*32 MiB/450 GB/s + 14*2 us = 0.16 ms each -> 21 ms per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.mesh import MeshShape
from orchestrator.placement.links import Link, LinkFigures, LinkModel, Member, worst
from orchestrator.topology.model import ClusterTopology

_MIB = 1 << 20


@dataclass(frozen=True)
class ModelDims:
    """What the cost model needs of the model and the batch (defaults: a 6.7B GPT, bf16)."""

    n_layers: int = 32
    d_model: int = 4096
    ffn_dim: int = 16384
    vocab_size: int = 32000
    seq_len: int = 4096
    micro_batch_size: int = 1
    pp_microbatches: int = 1
    grad_accum_steps: int = 1
    act_bytes: int = 2
    param_bytes: int = 2
    grad_bytes: int = 4  # gradients reduced in fp32
    ddp_bucket_mb: float = 25.0
    sequence_parallel: bool = False
    zero_stage: int | None = None  # None: 3 when dp_shard > 1
    moe_experts: int = 0  # 0: dense MLPs
    moe_top_k: int = 2
    moe_capacity_factor: float = 1.25

    @classmethod
    def from_spec(cls, spec: Any) -> ModelDims:
        """From a JobSpec-like object; an import-path model keeps the default block sizes, and
        user code (an entrypoint: sizes unknown) the defaults, with its ZeRO stage."""
        if getattr(spec, "entrypoint", None) is not None:
            return cls(zero_stage=spec.parallelism.effective_zero_stage())
        m, p, t = spec.model, spec.parallelism, spec.training
        base: dict[str, Any] = {"vocab_size": m.vocab_size, "seq_len": m.seq_len}
        if getattr(m, "kind", "gpt") == "gpt":
            base |= {"n_layers": m.n_layers, "d_model": m.d_model, "ffn_dim": m.ffn_dim}
            moe = getattr(m, "moe", None)
            if moe is not None:
                base |= {"moe_experts": moe.experts, "moe_top_k": moe.top_k,
                         "moe_capacity_factor": moe.capacity_factor}
        return cls(**base, micro_batch_size=t.micro_batch_size,
                   pp_microbatches=p.pp_microbatches, grad_accum_steps=t.grad_accum_steps,
                   ddp_bucket_mb=t.ddp.bucket_cap_mb, sequence_parallel=p.sequence_parallel,
                   zero_stage=p.effective_zero_stage())

    @property
    def block_params(self) -> int:
        return self.rank_block_params(1)

    def rank_block_params(self, ep: int) -> int:
        """One block's parameters on a rank of an ep group: attention, and the MLP, or, in a
        MoE block, the router and experts / ep of the experts."""
        if not self.moe_experts:
            return 4 * self.d_model * self.d_model + 2 * self.d_model * self.ffn_dim
        return (4 * self.d_model * self.d_model + self.d_model * self.moe_experts
                + self.moe_experts // ep * 2 * self.d_model * self.ffn_dim)

    @property
    def params(self) -> int:
        return self.n_layers * self.block_params + 2 * self.vocab_size * self.d_model


@dataclass(frozen=True)
class CommRow:
    dimension: str
    participants: int
    primitive: str  # all_reduce | all_gather | reduce_scatter | send_recv | all_to_all
    bytes_per_call: int
    calls_per_step: int
    overlap: float  # fraction the framework can hide behind compute

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _tp_rows(mesh: MeshShape, d: ModelDims, act: int, calls: int) -> list[CommRow]:
    if not d.sequence_parallel:
        return [CommRow("tp", mesh.tp, "all_reduce", act, calls, 0.0)]
    return [CommRow("tp", mesh.tp, "all_gather", act, calls, 0.0),
            CommRow("tp", mesh.tp, "reduce_scatter", act, calls, 0.0)]


def _bucketed(dim: str, n: int, total: int, bucket_mb: float, overlap: float) -> CommRow:
    bucket = max(1, int(bucket_mb * _MIB))
    return CommRow(dim, n, "all_reduce", min(total, bucket), max(1, math.ceil(total / bucket)),
                   overlap)


def _fsdp_rows(dim: str, n: int, d: ModelDims, *, stage_params: int, layers: int
               ) -> list[CommRow]:
    """FSDP (ZeRO-3) over the `n` ranks of `dim`: the workers shard over ep / cp ranks when
    dp_shard is 1."""
    per_layer = stage_params // max(1, layers)
    return [CommRow(dim, n, "all_gather", per_layer * d.param_bytes,
                    2 * layers * d.grad_accum_steps, 0.7),
            CommRow(dim, n, "reduce_scatter", per_layer * d.grad_bytes, layers, 0.7)]


def communication_signature(mesh: MeshShape, model: ModelDims | None = None) -> list[CommRow]:
    """Per-dimension communication of one optimizer step (only dimensions of degree > 1).

    >>> rows = communication_signature(MeshShape(tp=2, dp_replicate=2), ModelDims())
    >>> [(r.dimension, r.primitive) for r in rows]
    [('tp', 'all_reduce'), ('dp_replicate', 'all_reduce')]
    """
    d = model or ModelDims()
    layers = math.ceil(d.n_layers / mesh.pp)
    micro = max(1, d.micro_batch_size // d.pp_microbatches)
    steps = d.pp_microbatches * d.grad_accum_steps
    act = micro * d.seq_len * d.d_model * d.act_bytes
    stage_params = (layers * d.rank_block_params(mesh.ep)
                    + 2 * d.vocab_size * d.d_model // mesh.pp) // mesh.tp
    zero = d.zero_stage if d.zero_stage is not None else (3 if mesh.dp_shard > 1 else 0)
    rows: list[CommRow] = []
    if mesh.tp > 1:
        rows += _tp_rows(mesh, d, act, 4 * layers * steps)
    if mesh.dp_shard > 1:
        n = mesh.dp_shard
        if zero >= 2:
            layer_params = stage_params // layers
            gathers = 2 if zero == 3 else 1
            rows.append(CommRow("dp_shard", n, "all_gather", layer_params * d.param_bytes,
                                gathers * layers * d.grad_accum_steps, 0.7))
            # once per step: gradient sync is off until the last microbatch (the workers'
            # accumulation and torch's pipelining both defer it; memory.py counts the
            # unsharded gradients that holds)
            rows.append(CommRow("dp_shard", n, "reduce_scatter", layer_params * d.grad_bytes,
                                layers, 0.7))
        else:
            rows.append(_bucketed("dp_shard", n, stage_params * d.grad_bytes, d.ddp_bucket_mb,
                                  0.5))
            if zero == 1:
                rows.append(CommRow("dp_shard", n, "all_gather", stage_params * d.param_bytes,
                                    1, 0.0))
    if mesh.dp_replicate > 1:
        shard = stage_params // mesh.dp_shard if (mesh.dp_shard > 1 and zero >= 2) else stage_params
        rows.append(_bucketed("dp_replicate", mesh.dp_replicate, shard * d.grad_bytes,
                              d.ddp_bucket_mb, 0.5))
    if mesh.pp > 1:
        p2p = act // mesh.tp if d.sequence_parallel else act
        rows.append(CommRow("pp", 2, "send_recv", p2p, 2 * steps, 0.25))
    if mesh.ep > 1:
        routed = int(act // mesh.cp * d.moe_top_k * d.moe_capacity_factor)
        rows.append(CommRow("ep", mesh.ep, "all_to_all", routed, 4 * layers * steps, 0.0))
        if mesh.dp_shard == 1:
            rows += _fsdp_rows("ep", mesh.ep, d, stage_params=stage_params, layers=layers)
    if mesh.cp > 1:
        kv = 2 * act // mesh.cp
        rows.append(CommRow("cp", mesh.cp, "send_recv", kv, 3 * (mesh.cp - 1) * layers * steps,
                            0.5))
        if mesh.dp_shard == 1:
            rows += _fsdp_rows("cp", mesh.cp, d, stage_params=stage_params, layers=layers)
    return rows


def call_seconds(primitive: str, *, n: int, nbytes: int, link: Link) -> float:
    """Alpha-beta time of one call over n ranks on the bottleneck `link`."""
    if n < 2:
        return 0.0
    beta = nbytes / (link.gbs * 1e9)
    if primitive == "all_reduce":
        return 2 * (n - 1) / n * beta + 2 * (n - 1) * link.alpha_s
    if primitive in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * beta + (n - 1) * link.alpha_s
    if primitive == "send_recv":
        return beta + link.alpha_s
    if primitive == "all_to_all":
        return (n - 1) / n * beta + (n - 1) * link.alpha_s
    raise ValueError(f"unknown primitive {primitive!r}")


@dataclass(frozen=True)
class DimensionEstimate:
    dimension: str
    participants: int
    groups: int
    seconds: float  # per step, slowest group
    exposed_seconds: float
    bottleneck: str  # link kind of the slowest group, e.g. 'NV18', 'IB@leaf'
    bottleneck_gbs: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Estimate:
    dimensions: tuple[DimensionEstimate, ...]
    total_s: float
    exposed_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"total_s": self.total_s, "exposed_s": self.exposed_s,
                "dimensions": [d.as_dict() for d in self.dimensions]}


def _dimension_parts(mesh: MeshShape, dim: str,
                     slots: Sequence[Member]) -> Iterator[list[Sequence[Member]]]:
    """Per group, the member sets whose links bound it (pp: each consecutive stage pair)."""
    for ranks in mesh.groups(dim):
        if dim == "pp":
            yield [(slots[ranks[i]], slots[ranks[i + 1]]) for i in range(len(ranks) - 1)]
        else:
            yield [[slots[r] for r in ranks]]


def _row_seconds(rows: list[CommRow], link: Link, *, exposed: bool) -> float:
    return sum(r.calls_per_step * (1 - r.overlap if exposed else 1.0)
               * call_seconds(r.primitive, n=r.participants, nbytes=r.bytes_per_call, link=link)
               for r in rows)


def estimate_slots(slots: Sequence[Member], *, mesh: MeshShape, links: LinkModel,
                   model: ModelDims | None = None) -> Estimate:
    """Estimate for rank r placed on `slots[r]` = (node name, local GPU)."""
    est = estimate_below(slots, mesh=mesh, links=links, model=model, bound=None)
    assert est is not None
    return est


def estimate_below(slots: Sequence[Member], *, mesh: MeshShape, links: LinkModel,
                   model: ModelDims | None, bound: float | None) -> Estimate | None:
    """As estimate_slots, but None as soon as the total exceeds `bound` (the solver's best so
    far: a candidate already slower need not be costed to the end)."""
    if len(slots) != mesh.world_size:
        raise ValueError(f"{len(slots)} slots for world size {mesh.world_size}")
    rows = communication_signature(mesh, model)
    dims: list[DimensionEstimate] = []
    for dim in dict.fromkeys(r.dimension for r in rows):
        dim_rows = [r for r in rows if r.dimension == dim]
        # groups run concurrently: the dimension takes as long as its slowest group
        seen: dict[Link, float] = {}
        for parts in _dimension_parts(mesh, dim, slots):
            link = _worst_of(links, parts)
            if link is not None and link not in seen:
                seen[link] = _row_seconds(dim_rows, link, exposed=False)
        if seen:
            link = max(seen, key=lambda k: (seen[k], -k.gbs, k.kind))
            dims.append(DimensionEstimate(dim, dim_rows[0].participants,
                                          len(mesh.groups(dim)), seen[link],
                                          _row_seconds(dim_rows, link, exposed=True), link.kind,
                                          link.gbs))
            if bound is not None and sum(d.seconds for d in dims) > bound:
                return None
    return Estimate(tuple(dims), sum(d.seconds for d in dims), sum(d.exposed_seconds for d in dims))


def _worst_of(links: LinkModel, parts: list[Sequence[Member]]) -> Link | None:
    if len(parts) == 1:
        return links.group_link(parts[0])
    return worst(link for p in parts if (link := links.group_link(p)) is not None)


def estimate(placement: Any, *, cluster: ClusterTopology, model: ModelDims | None = None,
             figures: LinkFigures | None = None) -> Estimate:
    """Estimate for a `Placement` (anything with `.mesh` and `.ranks` of `.node`/`.gpu`)."""
    slots = [(r.node, r.gpu) for r in sorted(placement.ranks, key=lambda r: r.rank)]
    return estimate_slots(slots, mesh=placement.mesh, links=LinkModel(cluster, figures),
                          model=model)
