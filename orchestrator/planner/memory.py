"""Per-GPU memory of a training configuration: parameters, gradients, optimizer states,
activations. Pure module (stdlib only).

The ZeRO arithmetic (Rajbhandari et al. 2020) with Adam and mixed precision: per parameter
2 bytes of bf16 weights, 2 of bf16 gradients and 12 of fp32 optimizer state (master copy,
momentum, variance) = 16 bytes. ZeRO-1 shards the optimizer states over the dp_shard group,
ZeRO-2 also the gradients, ZeRO-3 also the parameters. Plain fp32 training (what the workers
run on CPU) is 4 + 4 + 8 bytes.

Activations per transformer block and microbatch of b sequences of s tokens, hidden h, TP
degree t (Korthikanti et al. 2022, "Reducing Activation Recomputation"), in 16-bit:
  no TP / TP without sequence parallel   s*b*h*(10 + 24/t)   (+ 5*a*s^2*b/t without a fused
  with sequence parallel                  s*b*h*34/t           attention kernel)
  full activation checkpointing           2*s*b*h              (block inputs only, plus one
                                                               block's working set at a time)
A pipeline stage holds the activations of its in-flight microbatches: 1F1B keeps
min(m, p) on the first stage, GPipe all m, interleaved 1F1B with v chunks per rank
min(m, p) * (1 + (p-1)/(p*v)).

What FSDP (ZeRO-2/3, `fully_shard`) holds beyond that arithmetic, as the workers run it:
- Gradient sync deferred to the last microbatch. torch.distributed.pipelining runs every
  microbatch's backward of an FSDP stage with gradient sync and re-sharding off and
  reduce-scatters once after the last (`perform_reduce_grad`); the workers' gradient
  accumulation with pp = 1 turns sync off the same way. Until then each rank accumulates
  the UNSHARDED gradients of its stage: grads = N * grad bytes, not N / dp_shard. The
  reduce-scatter is charged once per step (cost.py) because that is what runs. The workers
  keep this rather than re-shard per microbatch: that would multiply the gradient traffic
  by the microbatch count and override torch's schedule; the planner charges the memory and
  picks layouts that fit with it.
- ZeRO-3 with pp > 1: re-sharding after backward is off, so every backward leaves the
  stage's parameters all-gathered and the peak holds a full copy: + N * param bytes. With
  pp = 1 they are re-sharded after each block's backward (the root module and the block in
  use stay unsharded, not counted, as in the ZeRO paper's arithmetic).
- The sharded storage: with bf16 mixed precision it is the fp32 master copy that the 12
  optimizer bytes already count; in fp32 there is no separate master, so while a full copy
  is held (ZeRO-2 from forward to backward, pipelined ZeRO-3) the shard (N / dp_shard) is
  held next to it.
- The first pipeline stage keeps one more microbatch of its first chunk's activations: the
  forward torch.distributed.pipelining runs on the first microbatch to infer shapes keeps its
  graph (measured on torch 2.13 at 0.7 of a microbatch; counted as one, the upper bound).

Expert and context parallel, as the workers shard them: a MoE block's experts are split over
ep (each rank keeps experts / ep of them) and FSDP-sharded over dp_shard only; the dense
parameters (attention, router, norms, embedding, head) are FSDP-sharded over dp_shard x ep x
cp, fully (ZeRO-3) even when dp_shard is 1. cp ranks each hold seq_len / cp tokens of a
sequence, so activations and logits shrink by cp. The MLP activations of a MoE block are
counted as a dense MLP's (the routed copies and dispatch masks are not modelled).

`stage_memory(model, cfg, stage=r)` gives pipeline rank r's breakdown (its layers, the
embedding on rank 0, the head and logits on the last rank, its in-flight microbatches);
`memory_per_gpu` the busiest rank's.

Example: GPT-2 small (124M) in fp32 with AdamW on one device: 124M * 16 B = 1.99 GB of
parameters, gradients and states, plus activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

_PRECISION = {
    # name: (param bytes, grad bytes, optimizer bytes, activation element bytes)
    "bf16-mixed": (2, 2, 12, 2),
    "fp32": (4, 4, 8, 4),
}
# Precisions whose optimizer bytes include an fp32 master copy of the parameters (FSDP's
# sharded storage is then that master, not one more copy).
_SEPARATE_MASTER = frozenset({"bf16-mixed"})


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer. `params` overrides the derived count (published sizes)."""

    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    seq_len: int
    ffn_dim: int | None = None
    params: int | None = None
    name: str = "model"
    experts: int = 0  # MoE: every block's MLP is this many experts and a router
    top_k: int = 2  # MoE: experts each token is routed to
    capacity_factor: float = 1.25  # MoE: slots per expert (spec.MoE)

    @property
    def ffn(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.d_model

    @property
    def block_params(self) -> int:
        """Q, K, V, O projections, MLP up and down (per expert, plus the router, in a MoE
        block), two LayerNorms (the workers' GPT)."""
        mlp = 2 * self.d_model * self.ffn
        if self.experts:
            mlp = self.experts * mlp + self.d_model * self.experts
        return 4 * self.d_model ** 2 + mlp + 4 * self.d_model

    @property
    def expert_params(self) -> int:
        """The experts of one MoE block (0 for a dense model); the router is dense."""
        return self.experts * 2 * self.d_model * self.ffn

    @property
    def active_params(self) -> float:
        """Parameters each token's forward uses: a MoE block runs top_k of its experts."""
        if not self.experts:
            return self.total_params
        idle = self.n_layers * (self.experts - self.top_k) * 2 * self.d_model * self.ffn
        return self.total_params - idle * self.scale

    @property
    def embed_params(self) -> int:
        """Token + position embedding; the untied LM head and final norm come on top."""
        return self.vocab_size * self.d_model + self.seq_len * self.d_model

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.d_model + 2 * self.d_model

    @property
    def total_params(self) -> int:
        if self.params is not None:
            return self.params
        return self.n_layers * self.block_params + self.embed_params + self.head_params

    @property
    def scale(self) -> float:
        """Given / derived parameter count: spreads a published size over the layout."""
        derived = self.n_layers * self.block_params + self.embed_params + self.head_params
        return self.total_params / derived

    def layer_params(self) -> float:
        return self.block_params * self.scale

    @classmethod
    def from_gpt(cls, model: Any, *, name: str = "model") -> ModelShape:
        """From a spec.GPTModel-like object."""
        moe = getattr(model, "moe", None)
        return cls(n_layers=model.n_layers, d_model=model.d_model, n_heads=model.n_heads,
                   vocab_size=model.vocab_size, seq_len=model.seq_len, ffn_dim=model.ffn_dim,
                   name=name, experts=moe.experts if moe is not None else 0,
                   top_k=moe.top_k if moe is not None else 2,
                   capacity_factor=moe.capacity_factor if moe is not None else 1.25)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n_layers": self.n_layers, "d_model": self.d_model,
                "n_heads": self.n_heads, "ffn_dim": self.ffn, "vocab_size": self.vocab_size,
                "seq_len": self.seq_len, "experts": self.experts, "top_k": self.top_k,
                "capacity_factor": self.capacity_factor, "params": self.total_params}


@dataclass(frozen=True)
class MemoryBreakdown:
    params: float
    grads: float
    optimizer: float
    activations: float
    workspace: float = 0.0  # the optimizer step's temporaries (see memory_per_gpu)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.workspace

    def as_dict(self) -> dict[str, float]:
        return {"params_gb": self.params / 1e9, "grads_gb": self.grads / 1e9,
                "optimizer_gb": self.optimizer / 1e9, "activations_gb": self.activations / 1e9,
                "workspace_gb": self.workspace / 1e9, "total_gb": self.total / 1e9}


@dataclass(frozen=True)
class MemoryConfig:
    tp: int = 1
    pp: int = 1
    dp_shard: int = 1
    zero_stage: int = 0
    micro_batch: int = 1  # sequences per microbatch on one rank
    microbatches: int = 1  # per step (pipeline microbatches, or gradient accumulation)
    activation_checkpointing: bool = False
    sequence_parallel: bool = False
    schedule: str = "1f1b"  # 1f1b | gpipe (interleaved when virtual_stages > 1)
    virtual_stages: int = 1
    precision: str = "bf16-mixed"
    fused_attention: bool = True
    foreach_optimizer: bool = True  # CUDA default; on CPU torch steps one tensor at a time
    # The first and last of the pp * v chunks hold one layer fewer: the embedding and the
    # head take a layer's place (Llama 3's layout: 126 layers in 16 x 8 chunks).
    ends_as_layers: bool = False
    ep: int = 1  # expert parallel: each rank holds experts / ep of every MoE block
    cp: int = 1  # context parallel: each rank holds seq_len / cp tokens of every sequence

    @property
    def dense_shard(self) -> int:
        """Ranks FSDP shards the dense (non-expert) parameters over: dp_shard x ep x cp (the
        workers flatten ep and cp into the FSDP mesh)."""
        return max(1, self.dp_shard) * self.ep * self.cp

    @property
    def dense_zero(self) -> int:
        """The ZeRO stage of the dense parameters: with ep or cp but dp_shard = 1 the workers
        still fully shard them over the ep / cp ranks (ZeRO-3)."""
        if self.dp_shard > 1:
            return self.zero_stage
        return 3 if self.ep * self.cp > 1 else 0

    @property
    def deferred_sync(self) -> bool:
        """FSDP accumulates unsharded gradients over microbatches (see the module doc)."""
        return (self.dense_zero >= 2 and self.dense_shard > 1
                and (self.pp > 1 or self.microbatches > 1))


@lru_cache(maxsize=4096)
def chunk_layers(n_layers: int, chunks: int, *, ends_as_layers: bool = False
                 ) -> tuple[int, ...]:
    """Transformer blocks per pipeline chunk, in chunk order (chunk c sits on pp rank
    c % pp). Uneven counts go to the first chunks; with `ends_as_layers` the embedding and
    the head take one layer's place in the first and last chunk.

    >>> chunk_layers(10, 4)
    (3, 3, 2, 2)
    >>> llama3 = chunk_layers(126, 128, ends_as_layers=True)
    >>> llama3[:2], llama3[-2:]
    ((0, 1), (1, 0))
    """
    slots = n_layers + (2 if ends_as_layers and chunks > 1 else 0)
    base, extra = divmod(slots, chunks)
    per = [base + (1 if i < extra else 0) for i in range(chunks)]
    if ends_as_layers and chunks > 1:
        per[0] -= 1
        per[-1] -= 1
    if min(per) < 0 or sum(per) != n_layers:
        raise ValueError(f"{n_layers} layers cannot fill {chunks} pipeline chunks")
    return tuple(per)


def rank_layers(model: ModelShape, cfg: MemoryConfig, stage: int) -> tuple[int, int]:
    """(blocks on pp rank `stage`, blocks in its first chunk)."""
    per = chunk_layers(model.n_layers, cfg.pp * cfg.virtual_stages,
                       ends_as_layers=cfg.ends_as_layers)
    mine = per[stage::cfg.pp]
    return sum(mine), mine[0]


def stage_params(model: ModelShape, *, tp: int, pp: int, stage: int = 0,
                 cfg: MemoryConfig | None = None) -> float:
    """Parameters pipeline rank `stage` holds on one TP rank: its blocks, the embedding on
    the first rank, the LM head and final norm on the last."""
    c = cfg or MemoryConfig(tp=tp, pp=pp)
    blocks, _ = rank_layers(model, c, stage)
    ends = (model.embed_params if stage == 0 else 0) + \
        (model.head_params if stage == pp - 1 else 0)
    return (blocks * model.block_params + ends) * model.scale / tp


def stage_expert_params(model: ModelShape, cfg: MemoryConfig, *, stage: int = 0) -> float:
    """The experts (all of them, before ep) among `stage_params` of pipeline rank `stage`."""
    blocks, _ = rank_layers(model, cfg, stage)
    return blocks * model.expert_params * model.scale / cfg.tp


def in_flight(cfg: MemoryConfig, stage: int = 0) -> int:
    """Microbatches whose activations pipeline rank `stage` holds at the peak (1F1B warms
    up pp - stage microbatches, as torch's Schedule1F1B does)."""
    if cfg.pp == 1:
        return 1  # gradient accumulation frees each microbatch's activations in its backward
    if cfg.schedule == "gpipe":
        return cfg.microbatches
    return min(cfg.microbatches, cfg.pp - stage)


def in_flight_factor(cfg: MemoryConfig, stage: int = 0) -> float:
    """In-flight microbatches, times 1 + (p-1-stage)/(p*v) for interleaved 1F1B (the first
    rank warms up with extra chunks; Korthikanti et al. 2022, section 4.2.3)."""
    base = float(in_flight(cfg, stage))
    if cfg.pp > 1 and cfg.virtual_stages > 1:
        base *= 1 + (cfg.pp - 1 - stage) / (cfg.pp * cfg.virtual_stages)
    return base


def block_activation_bytes(model: ModelShape, cfg: MemoryConfig) -> float:
    s, b, h, t = model.seq_len // cfg.cp, cfg.micro_batch, model.d_model, cfg.tp
    elt = _PRECISION[cfg.precision][3] / 2  # the formulas count 16-bit elements
    per = s * b * h * (34 / t if cfg.sequence_parallel else 10 + 24 / t)
    per *= model.ffn / (4 * h) if model.ffn != 4 * h else 1.0
    if not cfg.fused_attention:
        per += 5 * model.n_heads * s * s * b / t
    return per * elt


def activation_bytes(model: ModelShape, cfg: MemoryConfig, stage: int = 0) -> float:
    """Peak activation bytes on pipeline rank `stage` (see the module doc)."""
    layers, first_chunk = rank_layers(model, cfg, stage)
    block = block_activation_bytes(model, cfg)
    elt = _PRECISION[cfg.precision][3]
    s, b, h = model.seq_len // cfg.cp, cfg.micro_batch, model.d_model
    per_layer = 2 * s * b * h * elt / 2 if cfg.activation_checkpointing else block
    working = block if cfg.activation_checkpointing else 0.0  # one block recomputed
    held = layers * per_layer * in_flight_factor(cfg, stage)
    last = stage == cfg.pp - 1
    # logits in fp32 for each in-flight microbatch of the last stage, plus one gradient
    logits = 4 * s * b * model.vocab_size / cfg.tp * (in_flight(cfg, stage) + 1) if last else 0.0
    # the first stage's shape-inference forward keeps its graph (module doc)
    retained = first_chunk * per_layer if cfg.pp > 1 and stage == 0 else 0.0
    return held + working + logits + retained


def stage_memory(model: ModelShape, cfg: MemoryConfig, *, stage: int = 0) -> MemoryBreakdown:
    """Bytes on pipeline rank `stage`, with the ZeRO stage sharding over dp_shard and what
    FSDP holds beyond it (see the module doc).

    `workspace`: PyTorch's multi-tensor (foreach) Adam/AdamW step computes sqrt(v) for every
    parameter it updates into a new fp32 tensor list before the update, so the step briefly
    holds one more fp32 copy of its (sharded) parameters. On CPU torch uses the per-tensor
    loop instead (`foreach_optimizer=False`): one temporary of the largest tensor, the
    (vocab x d_model) embedding or LM head.
    """
    if cfg.precision not in _PRECISION:
        raise ValueError(f"precision={cfg.precision!r}: use one of {sorted(_PRECISION)}")
    n = stage_params(model, tp=cfg.tp, pp=cfg.pp, stage=stage, cfg=cfg)
    experts = stage_expert_params(model, cfg, stage=stage)
    # Dense parameters are sharded over dp_shard x ep x cp; a rank keeps experts / ep of each
    # MoE block, sharded further over dp_shard only.
    dense = _sharded(n - experts, cfg, d=cfg.dense_shard, z=cfg.dense_zero)
    mine = _sharded(experts / cfg.ep, cfg, d=max(1, cfg.dp_shard), z=cfg.zero_stage)
    params, grads, optimizer, workspace = (a + b for a, b in zip(dense, mine, strict=True))
    return MemoryBreakdown(
        params=params, grads=grads, optimizer=optimizer,
        activations=activation_bytes(model, cfg, stage),
        workspace=(workspace if cfg.foreach_optimizer
                   else 4 * model.vocab_size * model.d_model / cfg.tp),
    )


def _sharded(n: float, cfg: MemoryConfig, *, d: int, z: int
             ) -> tuple[float, float, float, float]:
    """(params, grads, optimizer, foreach workspace) bytes of `n` parameters that ZeRO stage
    `z` shards over `d` ranks (see the module doc)."""
    pb, gb, ob, _ = _PRECISION[cfg.precision]
    z = z if d > 1 else 0
    deferred = z >= 2 and (cfg.pp > 1 or cfg.microbatches > 1)
    full_copy = z < 3 or (deferred and cfg.pp > 1)
    shard = z >= 3 or (z == 2 and cfg.precision not in _SEPARATE_MASTER)
    return (n * pb * (int(full_copy) + (1 / d if shard else 0)),
            n * gb / (d if z >= 2 and not deferred else 1),
            n * ob / (d if z >= 1 else 1),
            n * 4 / (d if z >= 1 else 1))


def memory_per_gpu(model: ModelShape, cfg: MemoryConfig) -> MemoryBreakdown:
    """Bytes on the busiest GPU: the pipeline rank with the largest total (the first holds
    the embedding and the most in-flight microbatches, the last the head and the logits)."""
    stages = (0, cfg.pp - 1) if cfg.pp > 1 else (0,)
    return max((stage_memory(model, cfg, stage=r) for r in stages), key=lambda m: m.total)


# Published sizes (params given where the derived count of a plain GPT block would differ:
# SwiGLU MLPs and grouped-query attention). ffn_dim is the equivalent two-matrix MLP width.
KNOWN_MODELS: dict[str, ModelShape] = {
    "gpt2": ModelShape(name="gpt2", n_layers=12, d_model=768, n_heads=12, vocab_size=50257,
                       seq_len=1024),
    "gpt2-medium": ModelShape(name="gpt2-medium", n_layers=24, d_model=1024, n_heads=16,
                              vocab_size=50257, seq_len=1024),
    "gpt2-xl": ModelShape(name="gpt2-xl", n_layers=48, d_model=1600, n_heads=25,
                          vocab_size=50257, seq_len=1024),
    "llama-7b": ModelShape(name="llama-7b", n_layers=32, d_model=4096, n_heads=32,
                           vocab_size=32000, seq_len=4096, ffn_dim=16512, params=6_738_000_000),
    "llama-70b": ModelShape(name="llama-70b", n_layers=80, d_model=8192, n_heads=64,
                            vocab_size=128256, seq_len=8192, ffn_dim=43008,
                            params=70_550_000_000),
    "llama-405b": ModelShape(name="llama-405b", n_layers=126, d_model=16384, n_heads=128,
                             vocab_size=128256, seq_len=8192, ffn_dim=79872,
                             params=405_000_000_000),
}
