"""The cluster as the planner sees it: free GPUs packed as the solver packs a job on an empty
cluster, the TP domain size, and the bottleneck link of each mesh dimension. Pure module.

Consecutive ranks share a node, nodes go in switch-tree order (fullest first inside a
subtree) and local GPU index = rail, so the first and last groups of a dimension are its
extremes; `dimension_link` costs only those (a 16,384-rank mesh has thousands of groups).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from orchestrator.mesh import MeshShape
from orchestrator.placement.links import Link, LinkFigures, LinkModel, Member
from orchestrator.placement.nodeinfo import islands
from orchestrator.topology.model import NVLINK_DOMAIN_LEVEL, ClusterTopology, is_nvlink


class PlanningError(ValueError):
    """The request cannot be planned (no free GPUs, bad batch); the message says the fix."""



@dataclass
class Layout:
    """Packed slots (rank -> (node, GPU)) and the links of each dimension's groups."""

    slots: list[Member]
    links: LinkModel
    tp_domain: int
    notes: tuple[str, ...]
    node_gpus: int = 1  # free GPUs of the fullest node used (the unit of "more GPUs")
    _cache: dict[tuple[object, ...], Link | None] = field(default_factory=dict)

    def dimension_link(self, mesh: MeshShape, dim: str) -> Link | None:
        key = (mesh.sizes, dim)
        if key not in self._cache:
            picks = _end_groups(mesh, dim)
            found = []
            for g in picks:
                members = [self.slots[r] for r in g]
                if dim == "pp":  # consecutive stage pairs bound a pipeline
                    pairs = [self.links.group_link(members[i:i + 2])
                             for i in range(len(members) - 1)]
                    found += [p for p in pairs if p is not None]
                elif (link := self.links.group_link(members)) is not None:
                    found.append(link)
            self._cache[key] = min(found, key=lambda k: (k.gbs, -k.alpha_s)) if found else None
        return self._cache[key]


def _end_groups(mesh: MeshShape, dim: str) -> list[list[int]]:
    """The groups along `dim` holding rank 0 and the last rank (not all of them: a 16,384-rank
    mesh has thousands of groups, and in a packed layout the ends are the extremes)."""
    size, stride = getattr(mesh, dim), mesh.stride(dim)
    if size == 1:
        return []
    last = mesh.world_size - 1 - (size - 1) * stride
    return [list(range(base, base + size * stride, stride)) for base in dict.fromkeys((0, last))]


def layout_for(cluster: ClusterTopology, *, gpus: int | None,
               figures: LinkFigures | None = None) -> Layout:
    """Free GPUs packed in switch-tree order, fullest nodes of a subtree first."""
    nodes = sorted((n for n in cluster.nodes if n.free_gpus),
                   key=lambda n: (cluster.path(n), -len(n.free_gpus), n.name))
    slots = [(n.name, g) for n in nodes for g in n.free_gpus]
    want = len(slots) if gpus is None else gpus
    if want < 1 or want > len(slots):
        raise PlanningError(f"{want} GPUs asked for but the cluster has {len(slots)} free; "
                            f"use --gpus <= {len(slots)}")
    slots = slots[:want]
    used = {name for name, _ in slots}
    notes: list[str] = []
    sizes = []
    any_nvlink = False
    for n in nodes:
        if n.name in used:
            free = set(n.free_gpus)
            isl = [len(free & comp) for comp in islands(n.topology)]
            sizes.append(max(isl, default=1))
            any_nvlink |= any(is_nvlink(k) for k in n.topology.links.values())
    domain = min(sizes) if sizes else 1
    if NVLINK_DOMAIN_LEVEL in cluster.levels:
        per_domain: Counter[str] = Counter()
        for n in nodes:
            if n.name in used:
                per_domain[n.labels.get(NVLINK_DOMAIN_LEVEL, n.name)] += len(n.free_gpus)
        domain = max(domain, min(per_domain.values()))
    if not any_nvlink:
        domain = min(len(n.free_gpus) for n in nodes if n.name in used)
        notes.append("no NVLink in the chosen nodes: TP groups may span a node's PCIe links")
    return Layout(slots=slots, links=LinkModel(cluster, figures), tp_domain=domain,
                  notes=tuple(notes),
                  node_gpus=max(len(n.free_gpus) for n in nodes if n.name in used))
