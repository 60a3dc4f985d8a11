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

Example: GPT-2 small (124M) in fp32 with AdamW on one device: 124M * 16 B = 1.99 GB of
parameters, gradients and states, plus activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_PRECISION = {
    # name: (param bytes, grad bytes, optimizer bytes, activation element bytes)
    "bf16-mixed": (2, 2, 12, 2),
    "fp32": (4, 4, 8, 4),
}


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

    @property
    def ffn(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.d_model

    @property
    def block_params(self) -> int:
        """Q, K, V, O projections, MLP up and down, two LayerNorms (the workers' GPT)."""
        return 4 * self.d_model ** 2 + 2 * self.d_model * self.ffn + 4 * self.d_model

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
        return cls(n_layers=model.n_layers, d_model=model.d_model, n_heads=model.n_heads,
                   vocab_size=model.vocab_size, seq_len=model.seq_len, ffn_dim=model.ffn_dim,
                   name=name)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n_layers": self.n_layers, "d_model": self.d_model,
                "n_heads": self.n_heads, "ffn_dim": self.ffn, "vocab_size": self.vocab_size,
                "seq_len": self.seq_len, "params": self.total_params}


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


def stage_params(model: ModelShape, *, tp: int, pp: int) -> float:
    """Parameters held by the largest pipeline stage on one TP rank (first stage: its blocks
    plus the embedding; the LM head of the last stage is counted with the same size)."""
    blocks = math.ceil(model.n_layers / pp) * model.block_params
    ends = model.embed_params + (model.head_params if pp == 1 else 0)
    return (blocks + ends) * model.scale / tp


def in_flight(cfg: MemoryConfig) -> int:
    """Microbatches whose activations one rank holds at the peak."""
    if cfg.pp == 1:
        return 1  # gradient accumulation frees each microbatch's activations in its backward
    if cfg.schedule == "gpipe":
        return cfg.microbatches
    return min(cfg.microbatches, cfg.pp)


def in_flight_factor(cfg: MemoryConfig) -> float:
    """In-flight microbatches, times 1 + (p-1)/(p*v) for interleaved 1F1B (the first rank
    warms up with extra chunks; Korthikanti et al. 2022, section 4.2.3)."""
    base = float(in_flight(cfg))
    if cfg.pp > 1 and cfg.virtual_stages > 1:
        base *= 1 + (cfg.pp - 1) / (cfg.pp * cfg.virtual_stages)
    return base


def block_activation_bytes(model: ModelShape, cfg: MemoryConfig) -> float:
    s, b, h, t = model.seq_len, cfg.micro_batch, model.d_model, cfg.tp
    elt = _PRECISION[cfg.precision][3] / 2  # the formulas count 16-bit elements
    per = s * b * h * (34 / t if cfg.sequence_parallel else 10 + 24 / t)
    per *= model.ffn / (4 * h) if model.ffn != 4 * h else 1.0
    if not cfg.fused_attention:
        per += 5 * model.n_heads * s * s * b / t
    return per * elt


def activation_bytes(model: ModelShape, cfg: MemoryConfig) -> float:
    """Peak activation bytes on the busiest rank (first pipeline stage)."""
    layers = math.ceil(model.n_layers / cfg.pp)
    block = block_activation_bytes(model, cfg)
    elt = _PRECISION[cfg.precision][3]
    s, b, h = model.seq_len, cfg.micro_batch, model.d_model
    if cfg.activation_checkpointing:
        per_mb = layers * 2 * s * b * h * elt / 2
        working = block  # one block recomputed at a time in backward
    else:
        per_mb = layers * block
        working = 0.0
    # logits and their gradient in fp32 on the last stage (pp=1: the same rank)
    logits = 2 * 4 * s * b * model.vocab_size / cfg.tp if cfg.pp == 1 else 0.0
    return per_mb * in_flight_factor(cfg) + working + logits


def memory_per_gpu(model: ModelShape, cfg: MemoryConfig) -> MemoryBreakdown:
    """Bytes per GPU, with the ZeRO stage sharding over dp_shard (see module doc).

    `workspace`: PyTorch's multi-tensor (foreach) Adam/AdamW step computes sqrt(v) for every
    parameter it updates into a new fp32 tensor list before the update, so the step briefly
    holds one more fp32 copy of its (sharded) parameters. On CPU torch uses the per-tensor
    loop instead (`foreach_optimizer=False`): one temporary of the largest tensor, the
    (vocab x d_model) embedding or LM head.
    """
    if cfg.precision not in _PRECISION:
        raise ValueError(f"precision={cfg.precision!r}: use one of {sorted(_PRECISION)}")
    pb, gb, ob, _ = _PRECISION[cfg.precision]
    n = stage_params(model, tp=cfg.tp, pp=cfg.pp)
    d = max(1, cfg.dp_shard)
    z = cfg.zero_stage
    return MemoryBreakdown(
        params=n * pb / (d if z >= 3 else 1),
        grads=n * gb / (d if z >= 2 else 1),
        optimizer=n * ob / (d if z >= 1 else 1),
        activations=activation_bytes(model, cfg),
        workspace=(n * 4 / (d if z >= 1 else 1) if cfg.foreach_optimizer
                   else 4 * model.vocab_size * model.d_model / cfg.tp),
    )


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
