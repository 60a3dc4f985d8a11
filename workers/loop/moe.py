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
as the ``moe_aux_loss`` metric, and `aux_loss_term` (``model.moe.aux_loss_coef`` times its mean
over the MoE layers) is added to the training loss: its gradient reaches the router through
``P_e`` (the assignment shares ``f_e`` come from a top-k and carry none). Being a mean over
sequences, the term of the global batch is the mean of the ranks' terms, so data-parallel
gradient averaging trains on exactly what the single-process reference does.
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
        self.aux_loss_coef = cfg.moe.aux_loss_coef
        self.router = nn.Linear(cfg.d_model, self.n_experts, bias=False)
        self.experts = Experts(self.n_experts, cfg.d_model, cfg.ffn_dim)
        self.ep_size = 1
        self.ep_group: Any = None
        self.ep_mesh: Any = None  # the 1-D DeviceMesh of the ep group (checkpoints use it)
        self.aux_loss: torch.Tensor | None = None

    def shard_experts(self, mesh: Any) -> None:
        """Keeps experts [ep_rank * n/ep, (ep_rank + 1) * n/ep) of the full (seeded, identical
        on every rank) set, ep_rank and ep being this rank's place in the 1-D DeviceMesh
        ``mesh``, and exchanges tokens over its group from now on."""
        ep_size, ep_rank = mesh.size(), mesh.get_local_rank()
        n = self.n_experts // ep_size
        keep = slice(ep_rank * n, (ep_rank + 1) * n)
        for name in ("w_up", "w_down"):
            full = getattr(self.experts, name)
            setattr(self.experts, name, nn.Parameter(full.detach()[keep].clone()))
        self.ep_size, self.ep_group, self.ep_mesh = ep_size, mesh.get_group(), mesh

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
        self.aux_loss = (e * (share * probs.mean(1)).sum(-1)).mean()
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
    vals = [m.aux_loss.detach() for m in moe_layers(module) if m.aux_loss is not None]
    return float(torch.stack(vals).mean()) if vals else None


def aux_loss_term(layers: list[MoE]) -> torch.Tensor | None:
    """``aux_loss_coef`` x the mean over `layers` of the last forward's load-balancing loss,
    to add to the training loss; None when there is nothing to add (no MoE layer, or a
    coefficient of 0)."""
    vals = [m.aux_loss for m in layers if m.aux_loss is not None]
    if not vals or layers[0].aux_loss_coef == 0:
        return None
    return layers[0].aux_loss_coef * torch.stack(vals).mean()


# The weights of `Experts`, the dimension 0 of which is the expert index.
EXPERT_WEIGHTS = ("w_up", "w_down")


class ExpertShards:
    """How a checkpoint sees expert-parallel weights: as DTensors of the full expert set.

    Under expert parallel each rank holds ``experts / ep`` experts under the same names, as
    plain tensors (dp_shard = 1: FSDP leaves them out) or as FSDP DTensors over
    ``mesh["dp_shard"]`` of that local block. `to_global` turns each expert weight, and each
    optimizer state of its shape (Adam's moments), into a DTensor over the layer's ep mesh
    with ``Shard(0)`` -- global shape ``(experts, ...)``, this rank's block at offset
    ``ep_rank * experts / ep`` -- gathering the dp_shard shards first; DCP then writes each
    block once (the dp_shard replicas deduplicate) and reads back any other split of the same
    experts. `load_into` copies the loaded blocks back into the tensors `to_global` was given
    (for an FSDP DTensor, its dp_shard shard of the block). A run without expert parallel
    saves its experts as full ``(experts, ...)`` tensors already, so checkpoints move between
    ep degrees.
    """

    def __init__(self, module: nn.Module) -> None:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            _CHECKPOINT_PREFIX,
        )

        # state-dict FQN prefix of each sharded layer's Experts ("layers.0.mlp.experts.")
        self._layers: dict[str, MoE] = {}
        for name, mod in module.named_modules():
            if isinstance(mod, MoE) and mod.ep_size > 1:
                fqn = name.replace(_CHECKPOINT_PREFIX, "")
                self._layers[f"{fqn}.experts." if fqn else "experts."] = mod

    def __bool__(self) -> bool:
        return bool(self._layers)

    def _layer(self, key: str) -> MoE | None:
        """The layer whose expert weight (or an optimizer state of it) `key` names."""
        for prefix, layer in self._layers.items():
            for w in EXPERT_WEIGHTS:
                for head in ("", "state."):
                    full = f"{head}{prefix}{w}"
                    if key == full or key.startswith(full + "."):
                        return layer
        return None

    def _expert_keys(self, sd: dict[str, Any]) -> list[tuple[str, MoE]]:
        out = []
        for key in sorted(sd):  # the same order on every rank: full_tensor is a collective
            layer = self._layer(key)
            value = sd[key]
            if layer is not None and isinstance(value, torch.Tensor) and value.dim() == 3:
                out.append((key, layer))
        return out

    def to_global(self, sd: dict[str, Any]) -> dict[str, Any]:
        """A copy of `sd` with every expert entry a DTensor of the full expert set."""
        from torch.distributed.tensor import DTensor, Shard

        out = dict(sd)
        for key, layer in self._expert_keys(sd):
            value = sd[key]
            block = value.full_tensor() if isinstance(value, DTensor) else value
            shape = (layer.n_experts, *block.shape[1:])
            out[key] = DTensor.from_local(block.detach(), layer.ep_mesh, [Shard(0)],
                                          run_check=False, shape=torch.Size(shape),
                                          stride=torch.empty(shape, device="meta").stride())
        return out

    def load_into(self, loaded: dict[str, Any], targets: dict[str, Any]) -> None:
        """Copies each expert entry of `loaded` (as `to_global` laid it out, now read back)
        into the tensor of `targets` under the same key."""
        from torch.distributed.tensor import DTensor

        for key, _ in self._expert_keys(targets):
            block = loaded[key].to_local()
            target = targets[key]
            if isinstance(target, DTensor):
                # FSDP2 shards dim 0 as torch.chunk does (the last shards may be short or empty).
                mesh_dim = target.device_mesh
                pieces = block.chunk(mesh_dim.size(), dim=0)
                r = mesh_dim.get_local_rank()
                local = target.to_local()
                if r < len(pieces) and local.numel():
                    local.copy_(pieces[r][:local.shape[0]])
            else:
                target.copy_(block)
