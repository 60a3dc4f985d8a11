"""Models: the built-in GPT and user models from an import path, each with its TP plan.

The GPT is laid out for splitting (torchtitan style): ``embed`` / ``layers`` (a ModuleDict keyed
"0".."n-1") / ``norm`` / ``lm_head``, and ``forward`` skips any of them that is None. A pipeline
stage is a deep copy with the other stages' layers deleted and the ends set to None, so
parameter names (FQNs) stay the same in every stage and checkpoints reshard across layouts.

With ``model.moe`` every block's MLP is a mixture of experts (`workers.loop.moe`).

Attention reads the local head count from the projection's output width, so the same code runs
whole or tensor-parallel (column-wise Q/K/V give each TP rank n_heads / tp heads).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.spec import GPTModel, ImportModel, JobSpec
from workers.loop.moe import MoE

# A TP plan maps module FQN patterns to torch.distributed.tensor.parallel styles, or is a
# callable (module, tp_mesh) -> None that applies TP itself.
TPPlan = dict[str, Any] | Callable[..., None]


class ModelBuildError(ValueError):
    """A model spec that parses but cannot be built (bad import path, wrong return type)."""


class Embed(nn.Module):
    def __init__(self, cfg: GPTModel) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        # Position ids: made per forward, except under context parallel, which shards a
        # position buffer along with the tokens (`shard_positions`). No buffer otherwise, so
        # DDP has nothing to broadcast before each forward.
        self.positions: torch.Tensor | None
        self.register_buffer("positions", None, persistent=False)

    def shard_positions(self) -> torch.Tensor:
        """The position buffer context parallel shards (each CP rank then embeds its own,
        load-balanced, sequence chunks at their true positions)."""
        if self.positions is None:
            weight = self.pos.weight
            device = weight.to_local().device if hasattr(weight, "to_local") else weight.device
            self.register_buffer("positions", torch.arange(self.pos.num_embeddings,
                                                           device=device), persistent=False)
        assert self.positions is not None
        return self.positions

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        pos = self.positions[:n] if self.positions is not None else torch.arange(
            n, device=tokens.device)
        return self.tok(tokens) + self.pos(pos)


class Attention(nn.Module):
    def __init__(self, cfg: GPTModel) -> None:
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_heads
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under TP the projections are column-sharded and hold n_heads / tp heads.
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTModel) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.down = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTModel) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model)
        self.mlp: nn.Module = MoE(cfg) if cfg.moe is not None else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTModel) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed: Embed | None = Embed(cfg)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear | nn.Embedding):
        nn.init.normal_(m.weight, mean=0.0, std=0.02)


def gpt_tp_plan(*, sequence_parallel: bool = False) -> dict[str, Any]:
    """Per-block TP plan: column-wise Q/K/V and MLP up, row-wise attention output and MLP down.

    Embedding, final norm and head stay replicated (small at these sizes, and it keeps the
    loss identical on every TP rank). With sequence parallel, the norms run on sequence shards
    and the row-wise outputs reduce-scatter onto the sequence dim.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        return {
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(),
        }
    seq = Shard(1)
    return {
        "attn_norm": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(output_layouts=seq),
        "mlp_norm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=seq),
    }


@dataclass
class BuiltModel:
    """A model on CPU plus how to tensor-parallelise it.

    ``block_plan`` applies to each entry of ``blocks_attr`` (a ModuleDict/ModuleList attribute)
    when present; ``root_plan`` applies to the root module. A user ``build`` may return a plan
    dict (root-relative FQNs) or a callable ``(module, tp_mesh) -> None``.
    """

    module: nn.Module
    vocab_size: int
    seq_len: int
    root_plan: TPPlan | None = None
    block_plan: dict[str, Any] | None = None
    blocks_attr: str | None = None
    sequence_parallel_entry: bool = False


def resolve_builder(path: str) -> Callable[..., Any]:
    """``pkg.module:build`` -> the callable, or ModelBuildError naming what is missing."""
    mod_name, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ModelBuildError(f"model.path {path!r}: cannot import module {mod_name!r} ({exc}); "
                              "check the spelling and that the package is installed on every "
                              "worker") from exc
    fn = getattr(mod, attr, None)
    if fn is None or not callable(fn):
        raise ModelBuildError(f"model.path {path!r}: module {mod_name!r} has no callable "
                              f"{attr!r}")
    return fn


def build_model(spec: JobSpec, *, seed: int) -> BuiltModel:
    """Builds the model on CPU with a seeded init (identical on every rank)."""
    m = spec.model
    torch.manual_seed(seed)
    if isinstance(m, GPTModel):
        sp = spec.parallelism.sequence_parallel and spec.parallelism.tp > 1
        return BuiltModel(module=GPT(m), vocab_size=m.vocab_size, seq_len=m.seq_len,
                          block_plan=gpt_tp_plan(sequence_parallel=sp), blocks_attr="layers",
                          sequence_parallel_entry=sp)
    return _build_import(m)


def _build_import(m: ImportModel) -> BuiltModel:
    fn = resolve_builder(m.path)
    try:
        out = fn(**m.kwargs)
    except TypeError as exc:
        raise ModelBuildError(f"model.path {m.path!r}: build(**model.kwargs) failed: "
                              f"{exc}") from exc
    plan: TPPlan | None = None
    if isinstance(out, tuple):
        if len(out) != 2:
            raise ModelBuildError(f"model.path {m.path!r}: build() returned a {len(out)}-tuple; "
                                  "return a module or (module, tp_plan)")
        out, plan = out
    if not isinstance(out, nn.Module):
        raise ModelBuildError(f"model.path {m.path!r}: build() returned {type(out).__name__}, "
                              "not a torch.nn.Module")
    if plan is not None and not (isinstance(plan, dict) or callable(plan)):
        raise ModelBuildError(f"model.path {m.path!r}: tp_plan must be a dict of FQN -> "
                              "ParallelStyle or a callable (module, tp_mesh)")
    return BuiltModel(module=out, vocab_size=m.vocab_size, seq_len=m.seq_len, root_plan=plan)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy; logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
