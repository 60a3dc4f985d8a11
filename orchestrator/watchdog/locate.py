"""Where each rank runs, in the words of a diagnosis: node, GPU, NVLink domain, switch levels,
mesh coordinates. Pure module (the topology model is pure too).

Mesh coordinates come from `orchestrator.mesh` (dimension order pp, dp_replicate, dp_shard,
tp, row-major, tp fastest). Example: dims {"pp": 2, "dp_shard": 2, "tp": 2}, rank 5 ->
{"pp": 1, "dp_shard": 0, "tp": 1}.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.mesh import MeshShape
from orchestrator.topology.model import NVLINK_DOMAIN_LEVEL, ClusterTopology
from orchestrator.watchdog.report import RankLocation


def mesh_coords(rank: int, dims: Mapping[str, int]) -> dict[str, int]:
    """The rank's coordinates along the dimensions of size > 1 (the ones a reader cares
    about); `dims` holds some of pp, dp_replicate, dp_shard, tp (missing ones are 1)."""
    if not dims:
        return {}
    shape = MeshShape.from_degrees(dims)
    return {d: c for d, c in shape.coords(rank).items() if getattr(shape, d) > 1}


def _labels(topology: ClusterTopology | None, node: str, gpu: int | None) -> dict[str, str]:
    if topology is None:
        return {}
    try:
        cn = topology.node(node)
    except KeyError:
        return {}
    labels: dict[str, str] = {}
    if NVLINK_DOMAIN_LEVEL not in topology.levels and gpu is not None:
        # Intra-node NVLink island: GPUs joined by NVLink paths share a domain name.
        for comp in cn.topology.nvlink_components():
            if gpu in comp and len(comp) > 1:
                labels[NVLINK_DOMAIN_LEVEL] = f"{node}/nvl{min(comp)}"
    for level in topology.levels:  # finest first
        value = cn.labels.get(level)
        if value:
            labels[level] = value
    return labels


def rank_locations(*, assignment: Mapping[int, tuple[str, int | None]],
                   topology: ClusterTopology | None = None,
                   mesh_dims: Mapping[str, int] | None = None) -> dict[int, RankLocation]:
    """assignment: rank -> (node name, local GPU index or None on CPU)."""
    return {r: RankLocation(node=node, gpu=gpu, labels=_labels(topology, node, gpu),
                            mesh=mesh_coords(r, mesh_dims or {}))
            for r, (node, gpu) in assignment.items()}
