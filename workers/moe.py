"""Mixture-of-experts MLP for the built-in GPT, with expert parallelism over an ``ep`` group.

Routing (per token): softmax over the router's logits, the ``top_k`` experts with their
probabilities renormalised as gates. Capacity is per sequence: each expert takes at most
``C = ceil(capacity_factor * seq_len * top_k / experts)`` of a sequence's assignments, first
choices before second ones, earlier tokens first; the rest are dropped (their contribution is
zero, the residual stream carries the token on). Being per sequence, routing and dropping do
not depend on how a batch is split over ranks, so a single process over the global batch
routes exactly as the expert-parallel job does (the parity reference).

Dispatch is dense: a ``(batch, top_k * seq, experts, C)`` one-hot places tokens into an
``(experts, batch, C, d)`` buffer. With ``ep > 1`` each rank holds ``experts / ep``
experts (`Experts`, a submodule so FSDP can shard it apart from the rest); the buffer's expert
blocks go to their owners and come back with ``all_to_all_single_autograd`` (torch's
functional collectives, differentiable), equal splits since every rank's buffer has the same
shape.

``aux_loss`` holds the last forward's load-balancing loss (Switch Transformer style, per
sequence then averaged: ``experts * sum_e f_e * P_e`` with ``f_e`` the share of assignments
to expert e and ``P_e`` its mean router probability; 1.0 is perfectly balanced). It is reported
as the ``moe_aux_loss`` metric and not added to the training objective.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.spec import GPTModel


class Experts(nn.Module):
    """``n`` two-layer GELU MLPs as batched weights: (n, d, ffn) and (n, ffn, d)."""

    def __init__(self, n: int, d_model: int, ffn: int) -> None:
        super().__init__()
        self.w_up = nn.Parameter(torch.empty(n, d_model, ffn))
        self.w_down = nn.Parameter(torch.empty(n, ffn, d_model))
        nn.init.normal_(self.w_up, mean=0.0, std=0.02)
        nn.init.normal_(self.w_down, mean=0.0, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (n, tokens, d) -> (n, tokens, d)."""
        return torch.bmm(F.gelu(torch.bmm(x, self.w_up)), self.w_down)


class MoE(nn.Module):
    def __init__(self, cfg: GPTModel) -> None:
        super().__init__()
        assert cfg.moe is not None
        self.n_experts = cfg.moe.experts
        self.top_k = cfg.moe.top_k
        self.capacity_factor = cfg.moe.capacity_factor
        self.router = nn.Linear(cfg.d_model, self.n_experts, bias=False)
        self.experts = Experts(self.n_experts, cfg.d_model, cfg.ffn_dim)
        self.ep_size = 1
        self.ep_group: Any = None
        self.aux_loss: torch.Tensor | None = None

    def shard_experts(self, *, group: Any, ep_rank: int, ep_size: int) -> None:
        """Keeps experts [ep_rank * n/ep, (ep_rank + 1) * n/ep) of the full (seeded, identical
        on every rank) set and exchanges tokens over ``group`` from now on."""
        n = self.n_experts // ep_size
        keep = slice(ep_rank * n, (ep_rank + 1) * n)
        for name in ("w_up", "w_down"):
            full = getattr(self.experts, name)
            setattr(self.experts, name, nn.Parameter(full.detach()[keep].clone()))
        self.ep_size, self.ep_group = ep_size, group

    def capacity(self, seq_len: int) -> int:
        return math.ceil(self.capacity_factor * seq_len * self.top_k / self.n_experts)

    def _all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        out = all_to_all_single_autograd(x.contiguous(), None, None, self.ep_group)
        return out.view_as(x) if out.shape == x.shape else out.reshape(x.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        e, k, c = self.n_experts, self.top_k, self.capacity(t)
        probs = F.softmax(self.router(x).float(), dim=-1)                 # (b, t, e)
        gate, choice = probs.topk(k, dim=-1)                              # (b, t, k)
        gate = gate / gate.sum(-1, keepdim=True)
        assign = F.one_hot(choice, e).to(probs.dtype)                     # (b, t, k, e)
        order = assign.transpose(1, 2).reshape(b, k * t, e)               # first choices first
        slot = order.cumsum(1) - 1
        keep = order * (slot < c)
        dispatch = keep.unsqueeze(-1) * F.one_hot(slot.clamp(0, c - 1).long(), c).to(
            probs.dtype)                                                  # (b, kt, e, c)
        dispatch = dispatch.to(x.dtype)
        tokens = x.unsqueeze(1).expand(b, k, t, d).reshape(b, k * t, d)
        buf = torch.einsum("bjec,bjd->ebcd", dispatch, tokens)           # (e, b, c, d)
        out = self._experts(buf)
        weights = dispatch * gate.transpose(1, 2).reshape(b, k * t, 1, 1).to(x.dtype)
        y = torch.einsum("bjec,ebcd->bjd", weights, out).reshape(b, k, t, d).sum(1)
        share = assign.sum(dim=(1, 2)) / (t * k)                          # (b, e)
        self.aux_loss = (e * (share * probs.mean(1)).sum(-1)).mean().detach()
        return y

    def _experts(self, buf: torch.Tensor) -> torch.Tensor:
        e, b, c, d = buf.shape
        if self.ep_size == 1:
            return self.experts(buf.reshape(e, b * c, d)).reshape(e, b, c, d)
        ep, local = self.ep_size, e // self.ep_size
        # Expert-major: chunk i (experts of rank i) goes to rank i; what arrives is, from each
        # source rank, its tokens for this rank's experts.
        got = self._all_to_all(buf).reshape(ep, local, b, c, d)
        x = got.transpose(0, 1).reshape(local, ep * b * c, d)
        y = self.experts(x).reshape(local, ep, b, c, d).transpose(0, 1)
        return self._all_to_all(y.reshape(e, b, c, d))


def moe_layers(module: nn.Module) -> list[MoE]:
    return [m for m in module.modules() if isinstance(m, MoE)]


def aux_loss_metric(module: nn.Module) -> float | None:
    """Mean over MoE layers of the last forward's load-balancing loss (this rank's tokens)."""
    vals = [m.aux_loss for m in moe_layers(module) if m.aux_loss is not None]
    return float(torch.stack(vals).mean()) if vals else None
