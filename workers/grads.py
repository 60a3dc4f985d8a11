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

import torch
from torch.distributed.tensor import DTensor


def _groups(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    by_key: dict[object, list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        key = (id(g.device_mesh), g.placements) if isinstance(g, DTensor) else "plain"
        by_key[key].append(g)
    return list(by_key.values())


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float:
    """Returns the total L2 norm of all gradients; scales them down to ``max_norm`` if set."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    groups = _groups(grads)
    sq = 0.0
    for group in groups:
        n = torch.nn.utils.get_total_norm(group, norm_type=2.0, foreach=True)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        sq += float(n) ** 2
    total = math.sqrt(sq)
    if max_norm is not None and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for group in groups:
            torch._foreach_mul_(group, coef)
    return total
