"""Global gradient norm and clipping across plain tensors and DTensors on different meshes.

``torch.nn.utils.clip_grad_norm_`` stacks every per-parameter norm into one tensor, which fails
when gradients are DTensors on different meshes (FSDP+TP: block weights on (dp, tp),
embedding on dp only). Here gradients are grouped by (mesh, placements); each group's norm is
a DTensor whose ``full_tensor()`` does the reduction over exactly the dims it is sharded on.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _groups(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    by_key: dict[object, list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        key = (id(g.device_mesh), g.placements) if isinstance(g, DTensor) else "plain"
        by_key[key].append(g)
    return list(by_key.values())


def _sq_norm(grads: list[torch.Tensor]) -> float:
    sq = 0.0
    for group in _groups(grads):
        n = torch.nn.utils.get_total_norm(group, norm_type=2.0, foreach=True)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        sq += float(n) ** 2
    return sq


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float | None, *,
                   split: set[torch.nn.Parameter] | None = None,
                   split_group: Any = None) -> float:
    """Returns the total L2 norm of all gradients; scales them down to ``max_norm`` if set.

    ``split`` parameters hold different slices on the ranks of ``split_group`` (expert
    parallel: each rank its own experts): their squared norms are summed over that group."""
    params = list(params)
    split = split or set()
    grads = [p.grad for p in params if p.grad is not None and p not in split]
    split_grads = [p.grad for p in params if p.grad is not None and p in split]
    if not grads and not split_grads:
        return 0.0
    sq = _sq_norm(grads) if grads else 0.0
    if split_group is not None:
        part = torch.tensor([_sq_norm(split_grads) if split_grads else 0.0],
                            dtype=torch.float64)
        device = (split_grads or grads)[0].device
        part = part.to(device)
        dist.all_reduce(part, group=split_group)
        sq += float(part)
    total = math.sqrt(sq)
    if max_norm is not None and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for group in _groups(grads + split_grads):
            torch._foreach_mul_(group, coef)
    return total
