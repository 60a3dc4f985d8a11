"""Where each rank runs, in the words of a diagnosis: node, GPU, NVLink domain, switch levels,
mesh coordinates. Pure module (the topology model is pure too).

Mesh coordinates follow ARCHITECTURE.md: dimension order (pp, dp_replicate, dp_shard, tp),
row-major, tp fastest. Example: dims {"pp": 2, "dp_shard": 2, "tp": 2}, rank 5 ->
{"pp": 1, "dp_shard": 0, "tp": 1}.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.topology.model import NVLINK_DOMAIN_LEVEL, ClusterTopology
from orchestrator.watchdog.report import RankLocation

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "tp")


def mesh_coords(rank: int, dims: Mapping[str, int]) -> dict[str, int]:
    """Row-major coordinates over MESH_ORDER (unknown dims last); size-1 dims are left out."""
    order = [d for d in MESH_ORDER if d in dims] + [d for d in dims if d not in MESH_ORDER]
    coords: dict[str, int] = {}
    rest = rank
    for d in reversed(order):
        size = max(1, int(dims[d]))
        coords[d] = rest % size
        rest //= size
    return {d: coords[d] for d in order if int(dims[d]) > 1}


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
