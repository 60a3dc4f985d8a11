"""Ranks from where the worker actors really landed. Pure module.

Ray's bundle order is not physical order and, inside a node, Ray picks which GPU index a
bundle gets. The solver planned (rank → node, GPU); here each planned rank is matched to an
actor on the same node: on each node the planned GPUs and the GPUs the actors got are both
sorted and paired in order, so the relative GPU order the solver chose (and the rank order
along it) is kept. CPU bundles keep their planned rank.

>>> bundles = [{"rank": 0, "node_id": "a", "gpu": 2}, {"rank": 1, "node_id": "a", "gpu": 3}]
>>> landed = [{"node_id": "a", "gpu_ids": [1]}, {"node_id": "a", "gpu_ids": [0]}]
>>> assign_ranks(bundles=bundles, landed=landed)
{1: 0, 0: 1}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.placement.mesh import MeshShape


def assign_ranks(*, bundles: Sequence[Mapping[str, Any]],
                 landed: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Bundle index → global rank. `landed[i]` is where bundle i's actor is (node_id, gpu_ids)."""
    if len(bundles) != len(landed):
        raise ValueError(f"{len(landed)} actors for {len(bundles)} bundles")
    out: dict[int, int] = {}
    by_node: dict[str, list[int]] = {}
    for i, (b, got) in enumerate(zip(bundles, landed, strict=True)):
        if b.get("node_id") and got["node_id"] != b["node_id"]:
            raise ValueError(f"bundle {i} landed on node {got['node_id']}, planned "
                             f"{b['node_id']}: the placement group ignored its label selector")
        if b.get("gpu") is None or not got.get("gpu_ids"):
            out[i] = int(b["rank"])
        else:
            by_node.setdefault(str(got["node_id"]), []).append(i)
    for idxs in by_node.values():
        planned = sorted((int(bundles[i]["gpu"]), int(bundles[i]["rank"])) for i in idxs)
        actual = sorted((int(landed[i]["gpu_ids"][0]), i) for i in idxs)
        for (_, rank), (_, i) in zip(planned, actual, strict=True):
            out[i] = rank
    if sorted(out.values()) != list(range(len(bundles))):
        raise ValueError(f"rank assignment is not a permutation: {sorted(out.values())}")
    return out


def mesh_coords(rank: int, parallelism: Mapping[str, Any]) -> dict[str, int]:
    """Mesh coordinates (pp, dp_replicate, dp_shard, tp) of `rank` for the spec's degrees."""
    shape = MeshShape(**{k: int(parallelism.get(k, 1)) for k in
                         ("pp", "dp_replicate", "dp_shard", "tp")})
    return shape.coords(rank)
