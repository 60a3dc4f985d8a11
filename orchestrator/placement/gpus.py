"""Which free GPUs of a node to take once BestFit has decided how many.

Pure module. When a node gives only part of its free GPUs, the choice matters: on a DGX-1
two TP pairs should be NVLink pairs, on a PCIe box PIX pairs; and the GPUs left behind should
stay in as few NVLink islands as possible. Candidates are scored by (worst link inside the
TP groups, bottleneck of the best ring through all of them, GPUs off the job's rails, NVLink
islands left behind, the indices), lowest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import comb

from orchestrator.placement.domains import Packing, tp_domains
from orchestrator.placement.links import LinkModel
from orchestrator.placement.nodeinfo import fingerprint, islands, uniform_kind
from orchestrator.placement.ranks import best_tp_groups
from orchestrator.spec import TopologyLevel
from orchestrator.topology.model import ClusterNode, link_cost

_SUBSET_LIMIT = 256  # subsets scored exhaustively; past this, the lowest indices


def _islands(node: ClusterNode, left: set[int]) -> int:
    return sum(1 for comp in islands(node.topology) if comp & left)


def _score(node: ClusterNode, subset: tuple[int, ...], *, free: Sequence[int], tp: int,
           links: LinkModel, rails: frozenset[int]) -> tuple[object, ...]:
    topo = node.topology
    groups = best_tp_groups(topo, subset, tp) if tp > 1 else []
    worst_in_groups = sum(max((link_cost(topo.link(a, b)) for a, b in combinations(g, 2)),
                              default=0.0) for g in groups)
    ring = links.ring(node.name, subset)
    ring_key = -(ring.gbs if ring else float("inf"))
    off_rail = sum(1 for g in subset if rails and g not in rails)
    return (worst_in_groups, ring_key, off_rail, _islands(node, set(free) - set(subset)), subset)


def pick_subset(node: ClusterNode, free: Sequence[int], n: int, *, tp: int, links: LinkModel,
                rails: frozenset[int] = frozenset()) -> list[int]:
    """n of the node's `free` GPUs (sorted)."""
    free = sorted(free)
    if n >= len(free):
        return free
    if uniform_kind(node.topology) is not None or comb(len(free), n) > _SUBSET_LIMIT:
        # uniform links make every subset alike (or there are too many to score): prefer
        # the job's rails, then the lowest indices
        preferred = sorted(free, key=lambda g: (bool(rails) and g not in rails, g))
        return sorted(preferred[:n])
    key = (fingerprint(node.topology), tuple(free), n, tp, rails & frozenset(free))
    hit = links.memo.get(key)
    if hit is None:  # nodes of one model with the same free GPUs share the answer
        subsets: list[tuple[int, ...]] = list(combinations(free, n))
        best = min(subsets,
                   key=lambda s: _score(node, s, free=free, tp=tp, links=links, rails=rails))
        hit = links.memo[key] = list(best)
    return list(hit)


def pick_node_gpus(node: ClusterNode, n: int, *, packing: Packing, links: LinkModel,
                   rails: frozenset[int] = frozenset(), pooled: bool = False,
                   only: frozenset[int] | None = None) -> list[int] | None:
    """n free GPUs of `node` (only among `only` when given; None when they cannot hold the
    TP groups). Strict NVLink packing keeps whole TP groups per NVLink component, BestFit
    over components (tightest that fits, else largest first)."""
    free = [g for g in node.free_gpus if only is None or g in only]
    if len(free) < n:
        return None
    if (not packing.strict or packing.tp_within != TopologyLevel.NVLINK_DOMAIN or pooled
            or packing.tp == 1):
        # (a single GPU is always inside one NVLink domain: no components to respect)
        return pick_subset(node, free, n, tp=packing.tp, links=links, rails=rails)
    comps = [c for c in tp_domains(node, free, TopologyLevel.NVLINK_DOMAIN) if len(c) >= packing.tp]
    groups = n // packing.tp
    if sum(len(c) // packing.tp for c in comps) < groups:
        return None
    out: list[int] = []
    left = sorted(comps, key=lambda c: (-(len(c) // packing.tp), len(c), c))
    while groups > 0:
        fits = [c for c in left if len(c) // packing.tp >= groups]
        comp = min(fits, key=lambda c: (len(c) // packing.tp, len(c), c)) if fits else left[0]
        take = min(groups, len(comp) // packing.tp)
        out += pick_subset(node, comp, take * packing.tp, tp=packing.tp, links=links, rails=rails)
        groups -= take
        left.remove(comp)
    return sorted(out)
