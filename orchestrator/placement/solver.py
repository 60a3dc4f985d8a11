"""Placement solver: rank -> (node, GPU) for a whole job, or a typed failure.

Pure module. Gang semantics: every rank is placed or none is. Steps:

1. Count capacity in TP groups (see `domains.py`): a TP group must fit inside one NVLink
   domain (or one node, per `tp_within`).
2. BestFit over the level hierarchy: find the finest level (node, then leaf, spine, ...,
   then the whole cluster) where one domain holds every TP group, and take the tightest such
   domains (least capacity, fewest free GPUs) as candidates; inside a candidate, recurse into
   the tightest child that fits, or take children largest first and close with the tightest.
3. More candidates, the same way: block-aligned BestFit (whole dp_shard groups or pipeline
   stages inside one node / leaf, `blocks.py`); a PACK-like fill (largest, best-linked child
   first); when a node's own links are slower than the network (PCIe NODE/SYS, single
   NVLinks), BestFit with at most m TP groups per node; and for each, GPUs chosen on common
   rails across partly used nodes.
4. For each candidate pick GPUs inside each node (`gpus.py`), assign ranks (`ranks.py`) and
   estimate the communication time (`cost.py`); the cheapest wins, ties going to the earliest
   candidate (plain BestFit, tightest domain). At most 16 candidates are costed. Everything is
   sorted, so the same input gives the same output.
5. When nothing fits, say why (`failure.py`): never fits this cluster, waiting for running
   jobs, or fragmented. In `preferred` mode the solver then relaxes tp_within to the node,
   then to best effort, before giving up.

Worked example: node-a (8 free), node-b (4 free, GPUs 4-7 busy), node-c (8 free), all NVSwitch;
tp=4, dp_replicate=1 -> one TP group; every node holds it, node-b is the tightest (cap 1,
4 free), so the job lands on node-b GPUs 0-3 and node-a and node-c stay whole for 8-GPU jobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from orchestrator.mesh import MeshShape
from orchestrator.placement.blocks import block_sizes, candidates
from orchestrator.placement.cost import Estimate, ModelDims, estimate_below
from orchestrator.placement.domains import Domain, Packing, build_tree, flatten, has_pools, shape
from orchestrator.placement.failure import FailureReason, PlacementFailure, explain
from orchestrator.placement.gpus import pick_node_gpus
from orchestrator.placement.links import LinkFigures, LinkModel, intra_node_link
from orchestrator.placement.nodeinfo import islands, nvlink_domain_key, uniform_kind
from orchestrator.placement.ranks import RankPlacement, assign_slots, to_rank_placements
from orchestrator.spec import ConstraintMode, JobSpec, PlacementConstraints, TopologyLevel
from orchestrator.topology.model import (
    NVLINK_DOMAIN_LEVEL,
    ClusterNode,
    ClusterTopology,
    NodeTopology,
)

__all__ = ["Constraints", "FailureReason", "Placement", "PlacementFailure", "solve", "solve_spec"]

_CANDIDATES = 4  # distinct domain shapes costed per block size
_SCAN = 64  # fitting domains looked at per block size to find those shapes
_MAX_COSTED = 16  # candidates costed per solve, in order (bounds the time on big clusters)
_RANK_BUDGET = 4096  # ...and fewer for big jobs: about this many ranks costed in all
_T = TypeVar("_T")


@dataclass(frozen=True)
class Constraints:
    """The spec's placement constraints (strings are accepted and turned into the enums)."""

    tp_within: TopologyLevel = TopologyLevel.NVLINK_DOMAIN
    mode: ConstraintMode = ConstraintMode.REQUIRED
    avoid_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "tp_within", TopologyLevel(self.tp_within))
        except ValueError:
            raise ValueError(f"tp_within={self.tp_within!r}: use 'nvlink_domain' or 'node'"
                             ) from None
        try:
            object.__setattr__(self, "mode", ConstraintMode(self.mode))
        except ValueError:
            raise ValueError(f"mode={self.mode!r}: use 'required' or 'preferred'") from None
        object.__setattr__(self, "avoid_nodes", tuple(self.avoid_nodes))

    @classmethod
    def from_spec(cls, placement: PlacementConstraints) -> Constraints:
        return cls(tp_within=placement.tp_within, mode=placement.mode,
                   avoid_nodes=tuple(placement.avoid_nodes))


@dataclass(frozen=True)
class Placement:
    mesh: MeshShape
    ranks: tuple[RankPlacement, ...]  # ordered by rank
    estimate: Estimate
    level: str  # finest level holding the whole job: node, leaf, ..., cluster
    domain: tuple[str, ...]  # that domain's label path (node name last for 'node')
    tp_within: TopologyLevel
    relaxed: bool = False  # preferred mode had to break tp_within
    notes: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.node for r in self.ranks))

    def gpus_by_node(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in self.ranks:
            out.setdefault(r.node, []).append(r.gpu)
        return {k: sorted(v) for k, v in out.items()}

    def as_dict(self) -> dict[str, Any]:
        return {"ranks": [r.as_dict() for r in self.ranks], "estimate": self.estimate.as_dict(),
                "mesh": self.mesh.as_dict(), "level": self.level, "domain": list(self.domain),
                "tp_within": self.tp_within, "relaxed": self.relaxed, "notes": list(self.notes)}


def solve(cluster: ClusterTopology, mesh: MeshShape, *, constraints: Constraints | None = None,
          model: ModelDims | None = None,
          figures: LinkFigures | None = None) -> Placement | PlacementFailure:
    """Place every rank of `mesh` on free GPUs of `cluster`, or say why not (see module doc)."""
    c = constraints or Constraints()
    avoid = frozenset(c.avoid_nodes)
    links = LinkModel(cluster, figures)
    tries = [Packing(mesh.tp, c.tp_within)]
    if c.mode == ConstraintMode.PREFERRED:
        if c.tp_within == TopologyLevel.NVLINK_DOMAIN:
            tries.append(Packing(mesh.tp, TopologyLevel.NODE))
        tries.append(Packing(mesh.tp, TopologyLevel.NODE, strict=False))
    def rate(node: ClusterNode, free: list[int]) -> float:
        ring = links.ring(node.name, free)
        return ring.gbs if ring is not None else float("inf")

    for packing in tries:
        root = build_tree(cluster, packing, avoid=avoid, links_gbs=rate)
        units = mesh.world_size // packing.unit
        if root.cap >= units:
            roots = [root] + [build_tree(cluster, packing, avoid=avoid, max_per_node=m,
                                         links_gbs=rate)
                              for m in _spreads(root, units=units, links=links)]
            placed = _best_candidate(cluster, mesh, roots=[r for r in roots if r.cap >= units],
                                     units=units, packing=packing, links=links, model=model)
            relaxed = packing.tp_within != c.tp_within or not packing.strict
            return _with_notes(placed, relaxed=relaxed, wanted=c.tp_within, links=links)
    return explain(cluster, mesh, packing=Packing(mesh.tp, c.tp_within), avoid=avoid)


def solve_spec(cluster: ClusterTopology, spec: JobSpec, *, avoid: tuple[str, ...] = (),
               figures: LinkFigures | None = None) -> Placement | PlacementFailure:
    """solve() for a JobSpec: its degrees, its placement constraints (plus the
    extra `avoid` nodes) and its model, so the estimate is for the job's own sizes."""
    c = Constraints.from_spec(spec.placement)
    return solve(cluster, MeshShape.from_parallelism(spec.parallelism),
                 constraints=Constraints(tp_within=c.tp_within, mode=c.mode,
                                         avoid_nodes=tuple(sorted({*c.avoid_nodes, *avoid}))),
                 model=ModelDims.from_spec(spec), figures=figures)


def _spreads(root: Domain, *, units: int, links: LinkModel) -> list[int]:
    """Caps on units per node worth trying. Packing a job into one node is best unless the
    node's own links are slower than the network (PCIe NODE/SYS paths, DGX-1 single NVLinks):
    then spreading some groups over nodes can be cheaper, and the cost model decides."""
    nodes = [d.node for d in root.nodes() if d.node is not None and d.cap > 0]
    if len(nodes) < 2 or all(_slowest_intra_gbs(n.topology, links) >= links.figures.network_gbs
                             for n in nodes):
        return []
    top = max(d.cap for d in root.nodes())
    out, m = [], 1
    while m < top and m < units:
        out.append(m)
        m *= 2
    return out


def _slowest_intra_gbs(topo: NodeTopology, links: LinkModel) -> float:
    kind = uniform_kind(topo)
    if kind is not None:
        return intra_node_link(kind, links.figures).gbs
    return min((intra_node_link(k, links.figures).gbs for k in set(topo.links.values())),
               default=float("inf"))


def _best_candidate(cluster: ClusterTopology, mesh: MeshShape, *, roots: list[Domain],
                    units: int, packing: Packing, links: LinkModel,
                    model: ModelDims | None) -> Placement:
    """The cheapest of the BestFit candidates (plain and block-aligned, see blocks.py, on the
    tree and on its spread variants), taken round-robin: the tightest domain of every kind
    first, then the runners-up. Ties go to the earliest. Big jobs cost fewer candidates
    (about 4,096 ranks' worth, at least one of each kind) to bound the solve time."""
    kinds = [(root, blk, True) for root in roots for blk in block_sizes(mesh)]
    # PACK-like: largest, best-linked nodes first, as Ray's PACK does over its nodes
    kinds += [(root if has_pools(root) else flatten(root), 1, False) for root in roots]
    streams = [_domains(root, units=units, per_block=blk * mesh.tp // packing.unit,
                        packing=packing, tight=tight) for root, blk, tight in kinds]
    budget = max(len(streams), min(_MAX_COSTED, _RANK_BUDGET // mesh.world_size))
    best: tuple[Estimate, list[tuple[str, int]], dict[str, list[int]]] | None = None
    tried: set[object] = set()
    for counts, rail_first in _round_robin(streams):
        if len(tried) >= budget:
            break
        chosen = _choose_gpus(cluster, counts, packing=packing, links=links,
                              rail_first=rail_first)
        if chosen is None:
            continue
        key = frozenset((n, tuple(g)) for n, g in chosen.items())
        if key in tried:
            continue
        tried.add(key)
        slots = assign_slots(cluster, mesh, chosen, tp_within=packing.tp_within)
        bound = None if best is None else best[0].total_s * (1 - 1e-9)
        est = estimate_below(slots, mesh=mesh, links=links, model=model, bound=bound)
        if est is not None and (bound is None or est.total_s < bound):
            best = (est, slots, chosen)
    assert best is not None, "capacity was checked before"
    est, slots, chosen = best
    level, domain = _spanned(cluster, chosen)
    return Placement(mesh=mesh, ranks=to_rank_placements(cluster, mesh, slots), estimate=est,
                     level=level, domain=domain, tp_within=packing.tp_within)


def _spanned(cluster: ClusterTopology, chosen: dict[str, list[int]]) -> tuple[str, tuple[str, ...]]:
    """The finest domain holding every chosen node: ('node', path + name), ('leaf', path)..."""
    nodes = {n.name: n for n in cluster.nodes}
    paths = [(*cluster.path(nodes[name]), name) for name, gpus in chosen.items() if gpus]
    common: tuple[str, ...] = ()
    for parts in zip(*paths, strict=False):
        if len(set(parts)) > 1:
            break
        common = (*common, parts[0])
    coarse_first = ("cluster", *reversed(cluster.levels), "node")
    return coarse_first[len(common)], common


def _domains(root: Domain, *, units: int, per_block: int, packing: Packing,
             tight: bool) -> Iterator[tuple[dict[str, int], bool]]:
    """BestFit choices of one kind, skipping domains shaped like one already yielded (same
    structure, same cost); each once as is and once with GPUs on common rails."""
    shapes: set[object] = set()
    for dom, counts in candidates(root, units=units, per_block=per_block, packing=packing,
                                  limit=_SCAN, tight=tight):
        twin = shape(dom)
        if twin in shapes:
            continue
        shapes.add(twin)
        if len(shapes) > _CANDIDATES:
            return
        yield counts, False
        yield counts, True


def _round_robin(streams: list[Iterator[_T]]) -> Iterator[_T]:
    live = list(streams)
    while live:
        for stream in list(live):
            item = next(stream, None)
            if item is None:
                live.remove(stream)
            else:
                yield item


def _choose_gpus(cluster: ClusterTopology, counts: dict[str, int], *, packing: Packing,
                 links: LinkModel, rail_first: bool = False) -> dict[str, list[int]] | None:
    """GPUs per node. Nodes taken whole go first; their indices become the rails the
    partially used nodes prefer, so data-parallel peers line up on the same local GPU.

    rail_first: partial nodes take GPU indices free on all of them (the first one's choice
    when it fits the others), even over better links inside a node; None when impossible.
    """
    pools = packing.pools and NVLINK_DOMAIN_LEVEL in cluster.levels
    nodes = {name: links.node(name) for name in counts}
    whole = [n for n in sorted(counts) if counts[n] >= len(nodes[n].free_gpus)]
    out: dict[str, list[int]] = {n: list(nodes[n].free_gpus) for n in whole}
    part_used = sorted(set(counts) - set(whole))
    rails = frozenset(g for n in whole for g in out[n])
    common: frozenset[int] | None = None
    if rail_first:
        if len(part_used) < 2:
            return None
        common = frozenset.intersection(*(frozenset(nodes[n].free_gpus) for n in part_used))
    for name in part_used:
        node = nodes[name]
        pooled = pools and nvlink_domain_key(cluster, node) is not None
        pick = partial(pick_node_gpus, node, counts[name], packing=packing, links=links,
                       rails=rails, pooled=pooled)
        if common is None:
            got = pick(only=None)
        else:
            same = frozenset(out[part_used[0]]) if name != part_used[0] else None
            got = (pick(only=same) if same else None) or pick(only=common)
        if got is None:
            return None
        out[name] = got
        rails |= frozenset(got)
    return out


def _with_notes(p: Placement, *, relaxed: bool, wanted: str, links: LinkModel) -> Placement:
    """Mark a preferred-mode placement whose TP groups really break `wanted`."""
    if not relaxed:
        return p
    notes = [n for group in p.mesh.groups("tp")
             if (n := _violation([p.ranks[r] for r in group], wanted=wanted, links=links))]
    if not notes:
        return p
    return Placement(mesh=p.mesh, ranks=p.ranks, estimate=p.estimate, level=p.level,
                     domain=p.domain, tp_within=p.tp_within, relaxed=True,
                     notes=(f"preferred tp_within={wanted} relaxed", *notes))


def _violation(members: list[RankPlacement], *, wanted: str, links: LinkModel) -> str | None:
    label = f"TP group of ranks {members[0].rank}-{members[-1].rank}"
    nodes = sorted({m.node for m in members})
    if len(nodes) > 1:
        domains = {links.nvlink_domain(n) for n in nodes}
        if wanted == TopologyLevel.NVLINK_DOMAIN and len(domains) == 1 and None not in domains:
            return None
        return f"{label} spans nodes {', '.join(nodes)}"
    if wanted == TopologyLevel.NVLINK_DOMAIN:
        gpus = {m.gpu for m in members}
        if not any(gpus <= comp for comp in islands(links.node(nodes[0]).topology)):
            return f"{label} on {nodes[0]} is not inside one NVLink domain"
    return None
