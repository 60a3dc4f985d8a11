"""Rank assignment: which global rank drives which (node, GPU) of a chosen GPU set.

Pure module. Mesh order is (pp, dp_replicate, dp_shard, tp), row-major, tp fastest (see
`mesh.py`). The rules, in the order they are applied:

1. Nodes are ordered along the switch tree, depth first: spine by spine, leaf by leaf, node by
   node; among siblings the one giving the job more GPUs comes first (so whole dp_shard
   groups and stages line up on them and a partly used node closes the run), then by label
   or name. Consecutive ranks therefore share a node, then a leaf.
2. TP groups are formed inside one NVLink domain (the node's NVLink component, or a
   multi-node `nvlink_domain` label) along the best links: the partition of the node's GPUs
   into groups of `tp` that minimises the worst link inside each group (then the sum of all
   links). On a DGX-1 hybrid cube mesh, tp=4 gives the NVLink-complete quads {0,1,2,3} and
   {4,5,6,7}; on a PCIe box, PIX pairs before PXB before SYS. GPUs left over (preferred mode
   only) are grouped inside their node, then across nodes in tree order.
3. TP groups are sorted by (node order, local GPU indices) and group i takes mesh slot i, i.e.
   the (pp, dp_replicate, dp_shard) coordinates of rank i * tp. So dp_shard peers sit in one
   node where they fit, dp_replicate next, and pp stages, the slowest dimension, spread across
   nodes and then leaves. Inside a group, tp rank t is the t-th GPU by (node order, index), so
   data-parallel peers of the same tp rank sit on the same local GPU index: rail-aligned.
4. Stable: the same GPU set on the same cluster always gives the same ranks.

After the gang reservation, `landed_ranks` applies the same rules to the GPUs the actors
really got (Ray's bundle order is not physical order): the runtime's one source of ranks.

Worked example: two 8-GPU NVSwitch nodes node-a, node-b under one leaf; tp=8, dp_replicate=2.
Groups: node-a {0..7}, node-b {0..7}. Ranks 0-7 -> node-a GPUs 0-7 (dp_replicate 0), ranks
8-15 -> node-b GPUs 0-7 (dp_replicate 1); the DP pairs (0, 8), (1, 9), ... (7, 15) each join
the same local GPU index on both nodes, one rail per pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from types import MappingProxyType
from typing import Protocol

from orchestrator.mesh import MeshShape
from orchestrator.placement.nodeinfo import (
    fingerprint,
    islands,
    nvlink_domain_key,
    uniform_kind,
)
from orchestrator.spec import TopologyLevel
from orchestrator.topology.model import (
    ClusterTopology,
    NodeTopology,
    link_cost,
)

NVLINK = TopologyLevel.NVLINK_DOMAIN
_EXHAUSTIVE_LIMIT = 3000  # partitions tried exhaustively; beyond, a greedy pass


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    node: str  # node name
    node_key: str  # Ray node id when known, else the name
    gpu: int  # local GPU (CUDA) index on that node
    coords: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "coords", MappingProxyType(dict(self.coords)))

    def __reduce__(self) -> tuple[object, ...]:
        return (RankPlacement, (self.rank, self.node, self.node_key, self.gpu, dict(self.coords)))

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "node": self.node, "node_key": self.node_key,
                "gpu": self.gpu, "coords": dict(self.coords)}


_ORDER: dict[int, tuple[ClusterTopology, dict[str, int]]] = {}


def node_order(cluster: ClusterTopology) -> dict[str, int]:
    """Position of every node along the switch tree (coarsest label first, then name)."""
    hit = _ORDER.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    ordered = sorted(cluster.nodes, key=lambda n: (cluster.path(n), n.name))
    out = {n.name: i for i, n in enumerate(ordered)}
    if len(_ORDER) > 64:  # clusters are few and long-lived; keep the cache small
        _ORDER.clear()
    _ORDER[id(cluster)] = (cluster, out)
    return out


def chosen_order(cluster: ClusterTopology, chosen: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Rule 1 for the nodes of a chosen GPU set: depth-first along the switch tree, and among
    siblings (spines, leaves, nodes) the one giving more GPUs first, then by label / name."""
    by_name = {n.name: n for n in cluster.nodes}
    names = [n for n in chosen if chosen[n]]
    paths = {n: (*cluster.path(by_name[n]), n) for n in names}
    share: dict[tuple[str, ...], int] = {}
    for n in names:
        for depth in range(1, len(paths[n]) + 1):
            prefix = paths[n][:depth]
            share[prefix] = share.get(prefix, 0) + len(chosen[n])
    ranked = sorted(names, key=lambda n: [(-share[paths[n][:d + 1]], paths[n][d])
                                          for d in range(len(paths[n]))])
    return {n: i for i, n in enumerate(ranked)}


def _group_cost(topo: NodeTopology, group: Sequence[int]) -> tuple[float, float]:
    costs = [link_cost(topo.link(a, b)) for a, b in combinations(group, 2)]
    return (max(costs, default=0.0), sum(costs))


def _partitions(items: tuple[int, ...], size: int):  # type: ignore[no-untyped-def]
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for combo in combinations(rest, size - 1):
        remaining = tuple(x for x in rest if x not in combo)
        for tail in _partitions(remaining, size):
            yield ((first, *combo), *tail)


def _partition_count(n: int, size: int) -> int:
    count, left = 1, n
    while left:
        c = 1
        for i in range(size - 1):
            c = c * (left - 1 - i) // (i + 1)
        count *= c
        left -= size
        if count > _EXHAUSTIVE_LIMIT:
            break
    return count


def best_tp_groups(topo: NodeTopology, gpus: Sequence[int], tp: int) -> list[tuple[int, ...]]:
    """Partition `gpus` (one node) into groups of `tp` along the best links.

    Returns len(gpus) // tp groups; GPUs that do not fill a group are left out.
    `best_tp_groups(dgx1, range(8), 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]`.
    """
    items = tuple(sorted(gpus))
    key = (fingerprint(topo), items, tp)
    hit = _GROUPS.get(key)
    if hit is None:
        hit = _best_tp_groups(topo, items, tp)
        if len(_GROUPS) > 65536:
            _GROUPS.clear()
        _GROUPS[key] = hit
    return list(hit)


_GROUPS: dict[tuple[object, ...], list[tuple[int, ...]]] = {}


def _best_tp_groups(topo: NodeTopology, items: tuple[int, ...],
                    tp: int) -> list[tuple[int, ...]]:
    k = len(items) // tp
    if k == 0:
        return []
    if tp == 1:
        return [(g,) for g in items]
    uniform = uniform_kind(topo) is not None
    if uniform or (len({topo.link(a, b) for a, b in combinations(items, 2)}) == 1
                   and len(items) % tp == 0):
        return [items[i * tp:(i + 1) * tp] for i in range(k)]
    if len(items) % tp == 0 and _partition_count(len(items), tp) <= _EXHAUSTIVE_LIMIT:
        best: tuple[tuple[float, float], tuple[tuple[int, ...], ...]] | None = None
        for part in _partitions(items, tp):
            costs = [_group_cost(topo, g) for g in part]
            key = (sum(c[0] for c in costs), sum(c[1] for c in costs))
            if best is None or key < best[0]:
                best = (key, part)
        assert best is not None
        return sorted(best[1])
    return _greedy_groups(topo, items, tp, k)


def _greedy_groups(topo: NodeTopology, items: tuple[int, ...], tp: int,
                   k: int) -> list[tuple[int, ...]]:
    left = list(items)
    out: list[tuple[int, ...]] = []
    while len(out) < k:
        first = left[0]
        rest = left[1:]
        if len(list(combinations(range(len(rest)), tp - 1))) <= 500:
            combo = min(combinations(rest, tp - 1),
                        key=lambda c: (_group_cost(topo, (first, *c)), c))
        else:  # nearest neighbours of `first`
            combo = tuple(sorted(rest, key=lambda g: (link_cost(topo.link(first, g)), g))[:tp - 1])
        group = tuple(sorted((first, *combo)))
        out.append(group)
        left = [g for g in left if g not in group]
    return sorted(out)


def _node_groups(topo: NodeTopology, gpus: Sequence[int], *, tp: int,
                 tp_within: TopologyLevel) -> tuple[list[tuple[int, ...]], list[int]]:
    """TP groups inside one node, and the GPUs left over."""
    chosen = set(gpus)
    comps = islands(topo) if tp_within == NVLINK else [frozenset(chosen)]
    groups: list[tuple[int, ...]] = []
    left: list[int] = []
    for comp in comps:
        part = sorted(chosen & comp)
        got = best_tp_groups(topo, part, tp)
        groups += got
        used = {g for grp in got for g in grp}
        left += [g for g in part if g not in used]
    left += sorted(chosen - set().union(*comps)) if comps else []
    if len(left) >= tp:  # only when constraints were relaxed: keep them in the node
        more = best_tp_groups(topo, left, tp)
        groups += more
        used = {g for grp in more for g in grp}
        left = [g for g in left if g not in used]
    return groups, sorted(left)


def tp_groups(cluster: ClusterTopology, chosen: Mapping[str, Sequence[int]], *, tp: int,
              tp_within: TopologyLevel = NVLINK) -> list[tuple[tuple[str, int], ...]]:
    """All TP groups of a chosen GPU set, in mesh-slot order (rule 3)."""
    order = chosen_order(cluster, chosen)
    nodes = {n.name: n for n in cluster.nodes}
    names = sorted((n for n in chosen if chosen[n]), key=lambda n: order[n])
    groups: list[tuple[tuple[str, int], ...]] = []
    pools: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for name in names:
        local, left = _node_groups(nodes[name].topology, chosen[name], tp=tp,
                                   tp_within=tp_within)
        groups += [tuple((name, g) for g in grp) for grp in local]
        nvl = nvlink_domain_key(cluster, nodes[name]) or ()
        pools.setdefault(nvl, []).extend((name, g) for g in left)
    spill: list[tuple[str, int]] = []
    for _label, members in pools.items():  # leftovers: one NVLink domain first, then anywhere
        whole = len(members) // tp * tp
        groups += [tuple(members[i:i + tp]) for i in range(0, whole, tp)]
        spill += members[whole:]
    spill.sort(key=lambda m: (order[m[0]], m[1]))
    groups += [tuple(spill[i:i + tp]) for i in range(0, len(spill) // tp * tp, tp)]
    if len(spill) % tp:
        raise ValueError(f"{sum(len(v) for v in chosen.values())} GPUs do not split into "
                         f"TP groups of {tp}")
    return sorted(groups, key=lambda grp: (order[grp[0][0]], tuple(g for _, g in grp)))


def assign_slots(cluster: ClusterTopology, mesh: MeshShape, chosen: Mapping[str, Sequence[int]],
                 *, tp_within: TopologyLevel = NVLINK) -> list[tuple[str, int]]:
    """(node name, GPU) of each global rank, for the GPUs in `chosen` (rules 1-4)."""
    total = sum(len(v) for v in chosen.values())
    if total != mesh.world_size:
        raise ValueError(f"{total} GPUs chosen for world size {mesh.world_size}")
    order = chosen_order(cluster, chosen)
    out: list[tuple[str, int]] = []
    for group in tp_groups(cluster, chosen, tp=mesh.tp, tp_within=tp_within):
        out += sorted(group, key=lambda m: (order[m[0]], m[1]))
    return out


def to_rank_placements(cluster: ClusterTopology, mesh: MeshShape,
                       slots: Sequence[tuple[str, int]]) -> tuple[RankPlacement, ...]:
    keys = {n.name: n.key for n in cluster.nodes}
    return tuple(RankPlacement(rank=rank, node=name, node_key=keys[name], gpu=gpu,
                               coords=mesh.coords(rank))
                 for rank, (name, gpu) in enumerate(slots))


def assign_ranks(cluster: ClusterTopology, mesh: MeshShape, chosen: Mapping[str, Sequence[int]],
                 *, tp_within: TopologyLevel = NVLINK) -> tuple[RankPlacement, ...]:
    """Global rank -> (node, GPU) for the GPUs in `chosen` (node name -> local GPU indices)."""
    return to_rank_placements(cluster, mesh,
                              assign_slots(cluster, mesh, chosen, tp_within=tp_within))


def ranks_for_actors(cluster: ClusterTopology, mesh: MeshShape, actors: Sequence[tuple[str, int]],
                     *, planned: Sequence[RankPlacement] = (),
                     tp_within: TopologyLevel = NVLINK) -> tuple[int, ...]:
    """The global rank of each actor, from the (node id or name, GPU index) it actually got.

    Ray's bundle order is not physical order, so ranks are computed from where the actors
    landed. When they landed exactly on the planned GPUs the planned ranks are kept;
    otherwise the same rules are applied to the GPUs they got.
    """
    if len(actors) != mesh.world_size:
        raise ValueError(f"{len(actors)} actors for world size {mesh.world_size}")
    names = {n.name: n.name for n in cluster.nodes} | {n.node_id: n.name for n in cluster.nodes
                                                        if n.node_id is not None}
    unknown = sorted({str(node) for node, _ in actors if node not in names})
    if unknown:
        raise ValueError(f"actors report nodes {unknown} that the cluster topology does not know")
    where = [(names[node], int(gpu)) for node, gpu in actors]
    if len(set(where)) != len(where):
        raise ValueError(f"two actors report the same GPU: {sorted(where)}")
    by_slot = {(p.node, p.gpu): p.rank for p in planned}
    if by_slot and set(by_slot) == set(where):
        return tuple(by_slot[w] for w in where)
    chosen: dict[str, list[int]] = {}
    for name, gpu in where:
        chosen.setdefault(name, []).append(gpu)
    placed = assign_ranks(cluster, mesh, chosen, tp_within=tp_within)
    lookup = {(p.node, p.gpu): p.rank for p in placed}
    return tuple(lookup[w] for w in where)


# -- ranks of landed actors ------------------------------------------------------------------
class PlannedRank(Protocol):
    """A planned rank's slot (placement.gang_plan.Bundle is one)."""

    @property
    def rank(self) -> int: ...
    @property
    def node(self) -> str: ...
    @property
    def node_id(self) -> str | None: ...
    @property
    def gpu(self) -> int | None: ...
    @property
    def coords(self) -> Mapping[str, int]: ...


def bundle_ranks(*, bundles: Sequence[PlannedRank],
                 landed: Sequence[tuple[str, int | None]]) -> dict[int, int]:
    """Bundle index -> global rank, keeping the planned ranks on each node. `landed[i]` is
    (Ray node id, GPU index or None) of bundle i's actor.

    Ray's bundle order is not physical order and, inside a node, Ray picks which GPU index a
    bundle gets. On each node the planned GPUs and the GPUs the actors got are both sorted and
    paired in order, so the relative GPU order the solver chose (and the rank order along it)
    is kept. CPU bundles keep their planned rank.

    Planned ranks 0, 1 on GPUs 2, 3 of node a; the actors got GPUs 1 and 0: bundle 1 (GPU 0)
    becomes rank 0 and bundle 0 (GPU 1) rank 1, so {0: 1, 1: 0}.
    """
    if len(bundles) != len(landed):
        raise ValueError(f"{len(landed)} actors for {len(bundles)} bundles")
    out: dict[int, int] = {}
    by_node: dict[str, list[int]] = {}
    for i, (b, (node_id, gpu)) in enumerate(zip(bundles, landed, strict=True)):
        if b.node_id and node_id != b.node_id:
            raise ValueError(f"bundle {i} landed on node {node_id}, planned "
                             f"{b.node_id}: the placement group ignored its label selector")
        if b.gpu is None or gpu is None:
            out[i] = b.rank
        else:
            by_node.setdefault(node_id, []).append(i)
    for idxs in by_node.values():
        planned = sorted((int(bundles[i].gpu or 0), bundles[i].rank) for i in idxs)
        actual = sorted((int(landed[i][1] or 0), i) for i in idxs)
        for (_, rank), (_, i) in zip(planned, actual, strict=True):
            out[i] = rank
    if sorted(out.values()) != list(range(len(bundles))):
        raise ValueError(f"rank assignment is not a permutation: {sorted(out.values())}")
    return out


def landed_ranks(*, bundles: Sequence[PlannedRank], landed: Sequence[tuple[str, int | None]],
                 mesh: MeshShape, cluster: ClusterTopology | None = None,
                 tp_within: TopologyLevel = NVLINK) -> tuple[int, ...]:
    """The global rank of each bundle's actor, from where it landed: the rules above
    (`ranks_for_actors`) for a GPU job with a known topology, else the planned ranks kept per
    node (`bundle_ranks`). The one place the runtime gets ranks from."""
    if cluster is None or any(gpu is None for _, gpu in landed):
        by_bundle = bundle_ranks(bundles=bundles, landed=landed)
        return tuple(by_bundle[i] for i in range(len(bundles)))
    planned = [RankPlacement(rank=b.rank, node=b.node, node_key=b.node_id or b.node,
                             gpu=int(b.gpu or 0), coords=b.coords) for b in bundles]
    return ranks_for_actors(cluster, mesh, [(n, int(g or 0)) for n, g in landed],
                            planned=planned, tp_within=tp_within)
