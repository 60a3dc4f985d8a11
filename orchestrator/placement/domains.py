"""The domain tree the solver's BestFit walks, and how many TP groups each domain can hold.

Pure module. The tree is root -> coarsest level (spine) -> ... -> finest level (leaf, or a
multi-node `nvlink_domain`) -> node. A domain's capacity is counted in *units*:

- strict packing (`unit == tp`): whole TP groups. A node holds sum(free // tp) over its TP
  domains (its NVLink components when tp_within=nvlink_domain, the whole node when
  tp_within=node); a multi-node NVLink domain ("pool") holds (its free GPUs) // tp, because a
  TP group may span its nodes; any other domain holds the sum of its children.
- relaxed packing (`unit == 1`, preferred mode when the constraint cannot hold): GPUs.

BestFit (`fill`), as in Kueue's topology-aware scheduling: inside a domain, if one child can
hold all k units, recurse into the tightest such child (least capacity, then fewest free GPUs,
then tree order) so the job spans as few levels as possible and leaves big holes intact;
otherwise take children largest first and close with the tightest child that holds the rest.

Example: leaves L0 = {a: 8 free, b: 8 free}, L1 = {c: 8 free, d: 2 free}, tp=2, 5 groups
(10 GPUs). No node holds 5 groups; both leaves do (4+4 = 8 groups and 4+1 = 5 groups), so
the tightest leaf L1 is chosen, and inside it c (4 groups) then d (1 group): L0 stays whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator.placement.nodeinfo import fingerprint, islands
from orchestrator.spec import TopologyLevel
from orchestrator.topology.model import (
    NVLINK_DOMAIN_LEVEL,
    ClusterNode,
    ClusterTopology,
)


@dataclass(frozen=True)
class Packing:
    """How capacity is counted: TP-group units (strict) or single GPUs (relaxed)."""

    tp: int
    tp_within: TopologyLevel
    strict: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp_within", TopologyLevel(self.tp_within))

    @property
    def unit(self) -> int:
        return self.tp if self.strict else 1

    @property
    def pools(self) -> bool:
        """Whether multi-node NVLink domains pool their GPUs for TP groups."""
        return self.strict and self.tp_within == TopologyLevel.NVLINK_DOMAIN


@dataclass
class Domain:
    level: str  # "node", a label level, or "cluster"
    path: tuple[str, ...]  # label values from the coarsest level down (node name last)
    order: int  # position along the switch tree
    children: list[Domain] = field(default_factory=list)
    node: ClusterNode | None = None
    cap: int = 0
    free: int = 0
    pool: bool = False
    links_gbs: float = 0.0  # slowest ring through a node's free GPUs; a domain: its worst node

    @property
    def name(self) -> str:
        return self.path[-1] if self.path else "cluster"

    def nodes(self) -> Iterable[Domain]:
        if self.node is not None:
            yield self
        for child in self.children:
            yield from child.nodes()


def free_of(node: ClusterNode, *, ignore_busy: bool) -> list[int]:
    return list(node.topology.gpu_indices) if ignore_busy else list(node.free_gpus)


def tp_domains(node: ClusterNode, free: Iterable[int],
               tp_within: TopologyLevel) -> list[list[int]]:
    """Free GPUs of each TP domain inside the node (NVLink components, or the whole node)."""
    free = sorted(free)
    if tp_within != TopologyLevel.NVLINK_DOMAIN:
        return [free]
    return [sorted(set(free) & comp) for comp in islands(node.topology)]


def node_cap(node: ClusterNode, free: list[int], packing: Packing) -> int:
    if not packing.strict:
        return len(free)
    return sum(len(d) // packing.tp for d in tp_domains(node, free, packing.tp_within))


def build_tree(cluster: ClusterTopology, packing: Packing, *, avoid: frozenset[str] = frozenset(),
               ignore_busy: bool = False, max_per_node: int | None = None,
               links_gbs: Callable[[ClusterNode, list[int]], float] | None = None) -> Domain:
    """The domain tree with capacities. Avoided nodes (by name or id) are left out.
    `max_per_node` caps each node's capacity (the solver's spread candidates); `links_gbs`
    rates a node's free GPUs (for the PACK-like fill's tie-break)."""
    levels = tuple(reversed(cluster.levels))  # coarsest first
    root = Domain(level="cluster", path=(), order=0)
    index: dict[tuple[str, ...], Domain] = {(): root}
    ordered = sorted(cluster.nodes, key=lambda n: (cluster.path(n), n.name))
    for i, node in enumerate(ordered):
        if node.name in avoid or (node.node_id is not None and node.node_id in avoid):
            continue
        parent = root
        full = cluster.path(node)
        for depth, level in enumerate(levels):
            path = full[:depth + 1]
            if path not in index:
                dom = Domain(level=level, path=path, order=i,
                             pool=level == NVLINK_DOMAIN_LEVEL and packing.pools and path[-1] != "")
                index[path] = dom
                parent.children.append(dom)
            parent = index[path]
        free = free_of(node, ignore_busy=ignore_busy)
        cap = node_cap(node, free, packing)
        if max_per_node is not None:
            cap = min(cap, max_per_node)
        leaf = Domain(level="node", path=(*full, node.name), order=i, node=node, cap=cap,
                      free=len(free), links_gbs=links_gbs(node, free) if links_gbs else 0.0)
        parent.children.append(leaf)
    _sum_caps(root, packing)
    return root


def _sum_caps(dom: Domain, packing: Packing) -> None:
    if dom.node is not None:
        return
    for child in dom.children:
        _sum_caps(child, packing)
    dom.free = sum(c.free for c in dom.children)
    dom.cap = dom.free // packing.tp if dom.pool else sum(c.cap for c in dom.children)
    dom.links_gbs = min((c.links_gbs for c in dom.children if c.cap > 0), default=0.0)


def flatten(root: Domain) -> Domain:
    """The cluster as one domain over all its nodes (no pools): for the PACK-like fill,
    which, like Ray's PACK, looks at nodes and not at the switch tree."""
    nodes = list(root.nodes())
    return Domain(level="cluster", path=(), order=0, children=nodes,
                  cap=sum(n.cap for n in nodes), free=sum(n.free for n in nodes),
                  links_gbs=min((n.links_gbs for n in nodes if n.cap > 0), default=0.0))


def has_pools(root: Domain) -> bool:
    return root.pool or any(has_pools(c) for c in root.children if c.node is None)


def bestfit_key(dom: Domain) -> tuple[int, int, int]:
    return (dom.cap, dom.free, dom.order)


def fill(dom: Domain, k: int, packing: Packing, *, tight: bool = True) -> dict[str, int]:
    """GPUs to take per node name so that `dom` holds k units (BestFit, see module doc).
    tight=False always takes the largest child first, best linked and most free first (a
    PACK-like variant the solver also costs: the tightest child is not always the best
    linked one)."""
    if dom.node is not None:
        return {dom.node.name: k * packing.unit}
    if dom.pool and sum(c.cap for c in dom.children) < k:
        return _fill_gpus(dom.children, k * packing.tp, tight=tight)
    out: dict[str, int] = {}
    left = sorted(dom.children, key=lambda c: take_order(c, c.cap, tight))
    while k > 0:
        fits = [c for c in left if c.cap >= k]
        child = min(fits, key=bestfit_key) if fits and tight else left[0]
        take = min(k, child.cap)
        if take <= 0:
            raise AssertionError("fill() called beyond the domain's capacity")
        out.update(fill(child, take, packing, tight=tight))
        k -= take
        left.remove(child)
    return out


def take_order(dom: Domain, cap: int, tight: bool) -> tuple[float, ...]:
    """Order children are taken in when none holds the rest: largest first; then BestFit
    takes the one with fewer free GPUs (less left behind), the PACK-like fill the better
    linked one, then the one with more free GPUs."""
    if tight:
        return (-cap, dom.free, dom.order)
    return (-cap, -dom.links_gbs, -dom.free, dom.order)


def _fill_gpus(nodes: list[Domain], n: int, *, tight: bool) -> dict[str, int]:
    """n GPUs across the nodes of one NVLink pool, BestFit on free GPU counts (or, not
    tight, best-linked and most free first)."""
    out: dict[str, int] = {}
    left = sorted((c for c in nodes if c.free > 0),
                  key=lambda c: (-c.free, c.order) if tight else (-c.links_gbs, -c.free, c.order))
    while n > 0:
        fits = [c for c in left if c.free >= n]
        child = min(fits, key=lambda c: (c.free, c.order)) if fits and tight else left[0]
        take = min(n, child.free)
        assert child.node is not None and take > 0
        out[child.node.name] = take
        n -= take
        left.remove(child)
    return out


def shape(dom: Domain) -> tuple[object, ...]:
    """Structure of a domain: equal shapes give equal placements up to node names."""
    if dom.node is not None:
        return (fingerprint(dom.node.topology), dom.node.free_gpus)
    return (dom.level, dom.pool, tuple(shape(c) for c in dom.children))
