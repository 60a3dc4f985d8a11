"""What the scheduler can place on: Ray's live nodes joined with the stored topology.

Ray knows which nodes are alive, their labels and how many GPUs / CPUs are free; it does not
know GPU links or which GPU *indices* are taken. The topology (declared file or discovery)
knows links. The join key is the node name: a Ray node's `meshyard.io/node` label, else a
declared node's explicit `node_id`, else (one node, one declaration) the only pair.

Busy GPU indices come from the control plane's own books (the ranks and placements of active
attempts); when Ray reports more GPUs in use than those explain (another Ray user), the
highest free indices are marked busy too so the counts agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology

NODE_NAME_LABEL = "meshyard.io/node"
_RAY_LABEL_PREFIX = "ray.io/"


@dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str
    labels: Mapping[str, str]
    gpus: int
    cpus: float
    free_gpus: int
    free_cpus: float
    is_head: bool = False

    @property
    def name(self) -> str:
        return self.labels.get(NODE_NAME_LABEL) or f"node-{self.node_id[:8]}"


@dataclass(frozen=True)
class Inventory:
    """The schedulable cluster now: topology with busy GPUs, plus free CPUs per node."""

    cluster: ClusterTopology
    ray_nodes: tuple[RayNode, ...]
    free_cpus: Mapping[str, float] = field(default_factory=dict)  # by node name

    @property
    def total_gpus(self) -> int:
        return sum(len(n.topology.gpus) for n in self.cluster.nodes)

    @property
    def free_gpus(self) -> int:
        return sum(len(n.free_gpus) for n in self.cluster.nodes)

    def node_by_id(self, node_id: str) -> ClusterNode | None:
        return next((n for n in self.cluster.nodes if n.node_id == node_id), None)

    def reserve(self, *, gpus: Mapping[str, Iterable[int]],
                cpus: Mapping[str, float]) -> Inventory:
        """A copy with more GPUs busy and fewer CPUs free (placements made in this tick)."""
        free = {k: v - cpus.get(k, 0.0) for k, v in self.free_cpus.items()}
        return Inventory(cluster=self.cluster.with_busy(gpus), ray_nodes=self.ray_nodes,
                         free_cpus=free)


def read_ray_nodes(ray_module: Any) -> list[RayNode]:
    """Alive Ray nodes with totals, free resources and labels (ray must be initialised)."""
    from ray._private.state import state  # the per-node view has no public API in 2.x

    avail = state.available_resources_per_node()
    out = []
    for n in ray_module.nodes():
        if not n.get("Alive"):
            continue
        res, free = n.get("Resources", {}), avail.get(n["NodeID"], {})
        out.append(RayNode(
            node_id=n["NodeID"], ip=n.get("NodeManagerAddress", ""),
            labels={k: v for k, v in (n.get("Labels") or {}).items()},
            gpus=int(res.get("GPU", 0)), cpus=float(res.get("CPU", 0)),
            free_gpus=int(free.get("GPU", 0)), free_cpus=float(free.get("CPU", 0)),
            is_head="node:__internal_head__" in res))
    return out


def _match(ray_nodes: list[RayNode], declared: ClusterTopology | None
           ) -> list[tuple[RayNode, ClusterNode | None]]:
    if declared is None:
        return [(rn, None) for rn in ray_nodes]
    by_name = {n.name: n for n in declared.nodes}
    by_id = {n.node_id: n for n in declared.nodes if n.node_id}
    pairs = []
    for rn in ray_nodes:
        d = by_id.get(rn.node_id) or by_name.get(rn.labels.get(NODE_NAME_LABEL, ""))
        pairs.append((rn, d))
    gpu_nodes = [rn for rn in ray_nodes if rn.gpus]
    if len(gpu_nodes) == 1 and len(declared.nodes) == 1 and all(d is None for _, d in pairs):
        return [(rn, declared.nodes[0] if rn.gpus else None) for rn in ray_nodes]
    return pairs


def build_inventory(*, ray_nodes: list[RayNode], declared: ClusterTopology | None,
                    busy: Mapping[str, Iterable[int]] | None = None) -> Inventory:
    """Joins Ray nodes with the topology. `busy`: GPU indices held by our attempts, by node id.

    Ray nodes without GPUs stay in the inventory (CPU jobs run there) with an empty topology;
    a GPU node with no declared topology gets a uniform one (links unknown: 'SYS').
    """
    busy = busy or {}
    nodes, free_cpus = [], {}
    levels = declared.levels if declared is not None else ()
    for rn, d in _match(ray_nodes, declared):
        topo = d.topology if d is not None else NodeTopology.uniform(rn.gpus, "SYS")
        if len(topo.gpus) != rn.gpus:
            # Ray is the authority on what exists; trust the declaration only when it agrees.
            topo = NodeTopology.uniform(rn.gpus, "SYS")
        name = d.name if d is not None else rn.name
        labels = {k: v for k, v in rn.labels.items() if not k.startswith(_RAY_LABEL_PREFIX)}
        if d is not None:
            labels.update(d.labels)
        held = set(busy.get(rn.node_id, ())) | set(d.busy_gpus if d is not None else ())
        held = _pad_busy(held, topo.gpu_indices, in_use=rn.gpus - rn.free_gpus)
        nodes.append(ClusterNode(name=name, topology=topo, labels=labels, node_id=rn.node_id,
                                 busy_gpus=frozenset(held)))
        free_cpus[name] = rn.free_cpus
    return Inventory(cluster=ClusterTopology(levels=levels, nodes=tuple(nodes)),
                     ray_nodes=tuple(ray_nodes), free_cpus=free_cpus)


def _pad_busy(held: set[int], indices: tuple[int, ...], *, in_use: int) -> set[int]:
    out = {g for g in held if g in indices}
    for g in sorted(indices, reverse=True):
        if len(out) >= in_use:
            break
        out.add(g)
    return out


def reserved_gpus(placements: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """GPU indices held by active attempts, by Ray node id, from their stored placements."""
    out: dict[str, list[int]] = {}
    for p in placements:
        for b in p.get("bundles", []):
            if b.get("gpu") is not None and b.get("node_id"):
                out.setdefault(b["node_id"], []).append(int(b["gpu"]))
    return out
