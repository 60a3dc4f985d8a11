"""The cluster now: what the scheduler can place on, and the same view for the API. Pure module.

Ray knows which nodes are alive, their labels and how many GPUs / CPUs are free; it does not
know GPU links or which GPU *indices* are taken. The topology (declared file or discovery)
knows links. The join key is the node name: a Ray node's `meshyard.io/node` label, else a
declared node's explicit `node_id`, else (one node, one declaration) the only pair.

Busy GPU indices come from the control plane's own books (`gpu_holds`: where an active job's
ranks are, else where its current attempt is planned, so a PLACING job's GPUs are busy too);
when Ray reports more GPUs in use than those explain (another Ray user), the highest free
indices are marked busy too so the counts agree.

Two readers, one model: the scheduler builds a `ClusterSnapshot` from Ray's live nodes
(`build_snapshot`); the API, which may run without Ray, builds the topology from the nodes the
runtime stored (`cluster_from_records`). Both take their busy GPUs from `gpu_holds`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology
from orchestrator.topology.serialize import node_topology_from_dict

NODE_NAME_LABEL = "meshyard.io/node"
_RAY_LABEL_PREFIX = "ray.io/"


class StoredNode(Protocol):
    """A node as the store keeps it (orchestrator.store.records.NodeRecord)."""

    @property
    def name(self) -> str: ...
    @property
    def node_id(self) -> str | None: ...
    @property
    def alive(self) -> bool: ...
    @property
    def gpus(self) -> int: ...
    @property
    def labels(self) -> Mapping[str, Any]: ...
    @property
    def topology(self) -> Mapping[str, Any]: ...


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
class ClusterSnapshot:
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
                cpus: Mapping[str, float]) -> ClusterSnapshot:
        """A copy with more GPUs busy and fewer CPUs free (placements made in this tick)."""
        free = {k: v - cpus.get(k, 0.0) for k, v in self.free_cpus.items()}
        return ClusterSnapshot(cluster=self.cluster.with_busy(gpus), ray_nodes=self.ray_nodes,
                         free_cpus=free)


def newest_per_name(ray_nodes: list[RayNode], *, first_seen: Mapping[str, float],
                    stored: Mapping[str, str | None] | None = None
                    ) -> tuple[list[RayNode], list[tuple[str, list[str]]]]:
    """One Ray node per `meshyard.io/node` name. A host whose Ray restarts joins as a new node
    while Ray still lists its old incarnation alive (until the missed heartbeats add up, about
    a minute): of two live nodes with one name, the one this process first saw later is kept;
    seen at once, the one the store holds for the name (`stored`: name -> node id), else the
    larger node id. Returns the nodes kept, in their order, and per duplicated name the ids
    left out.

    >>> a = RayNode("aa", "10.0.0.3", {NODE_NAME_LABEL: "h3"}, 0, 2.0, 0, 2.0)
    >>> b = RayNode("bb", "10.0.0.3", {NODE_NAME_LABEL: "h3"}, 0, 2.0, 0, 2.0)
    >>> kept, dropped = newest_per_name([b, a], first_seen={"aa": 1.0, "bb": 9.0})
    >>> [n.node_id for n in kept], dropped
    (['bb'], [('h3', ['aa'])])
    """
    stored = stored or {}
    groups: dict[str, list[RayNode]] = {}
    for rn in ray_nodes:
        name = rn.labels.get(NODE_NAME_LABEL)
        if name:
            groups.setdefault(name, []).append(rn)
    drop: set[str] = set()
    dropped = []
    for name, group in sorted(groups.items()):
        if len(group) < 2:
            continue
        keep = max(group, key=lambda rn: (first_seen.get(rn.node_id, 0.0),
                                          stored.get(name) == rn.node_id, rn.node_id))
        out = sorted(rn.node_id for rn in group if rn is not keep)
        drop.update(out)
        dropped.append((name, out))
    return [rn for rn in ray_nodes if rn.node_id not in drop], dropped


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


def build_snapshot(*, ray_nodes: list[RayNode], topology: ClusterTopology | None,
                   busy: Mapping[str, Iterable[int]] | None = None) -> ClusterSnapshot:
    """Joins Ray nodes with the topology (declared or discovered). `busy`: GPU indices held by
    our attempts, by Ray node id (`holds.busy_gpus`).

    Ray nodes without GPUs stay in the inventory (CPU jobs run there) with an empty topology;
    a GPU node with no declared topology gets a uniform one (links unknown: 'SYS').
    """
    busy = busy or {}
    nodes, free_cpus = [], {}
    levels = topology.levels if topology is not None else ()
    for rn, d in _match(ray_nodes, topology):
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
    return ClusterSnapshot(cluster=ClusterTopology(levels=levels, nodes=tuple(nodes)),
                           ray_nodes=tuple(ray_nodes), free_cpus=free_cpus)


def _pad_busy(held: set[int], indices: tuple[int, ...], *, in_use: int) -> set[int]:
    out = {g for g in held if g in indices}
    for g in sorted(indices, reverse=True):
        if len(out) >= in_use:
            break
        out.add(g)
    return out


def cluster_from_records(nodes: Iterable[StoredNode], *, levels: tuple[str, ...] = (),
                         busy: Mapping[str, Iterable[int]] | None = None) -> ClusterTopology:
    """The alive GPU nodes the runtime stored (GET /v1/cluster), busy where `busy` says (keyed
    by node name or Ray node id): the API's view of the cluster now, without Ray."""
    busy = busy or {}
    out = []
    for n in nodes:
        if not n.alive or n.gpus <= 0 or not n.topology:
            continue
        held = set(busy.get(n.name, ())) | set(busy.get(n.node_id or "", ()))
        out.append(ClusterNode(name=n.name, topology=node_topology_from_dict(dict(n.topology)),
                               labels={k: str(v) for k, v in n.labels.items()},
                               node_id=n.node_id, busy_gpus=frozenset(held)))
    return ClusterTopology(levels=levels, nodes=tuple(out))
