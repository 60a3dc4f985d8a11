"""Per-node facts the solver asks for many times, cached by topology identity.

Pure module. A 512-node declared cluster builds one NodeTopology per node, so these must be
cheap on first sight too: a node whose pairs are all NVLink (NVSwitch) is one island without
running the union-find.
"""

from __future__ import annotations

from orchestrator.topology.model import (
    NVLINK_DOMAIN_LEVEL,
    ClusterNode,
    ClusterTopology,
    NodeTopology,
    is_nvlink,
)

_CACHE_MAX = 8192
_islands: dict[int, tuple[NodeTopology, list[frozenset[int]]]] = {}


def islands(topo: NodeTopology) -> list[frozenset[int]]:
    """The node's NVLink domains (NVLink-connected GPU sets), as `nvlink_components()`."""
    hit = _islands.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    gpus = topo.gpu_indices
    kinds = set(topo.links.values())
    n = len(gpus)
    if n and len(topo.links) == n * (n - 1) // 2 and all(is_nvlink(k) for k in kinds):
        out = [frozenset(gpus)]
    elif not any(is_nvlink(k) for k in kinds):
        out = [frozenset([g]) for g in sorted(gpus)]
    else:
        out = topo.nvlink_components()
    if len(_islands) >= _CACHE_MAX:
        _islands.clear()
    _islands[id(topo)] = (topo, out)
    return out


_uniform: dict[int, tuple[NodeTopology, str | None]] = {}


def uniform_kind(topo: NodeTopology) -> str | None:
    """The single link class of a node whose every GPU pair has it (NVSwitch), else None."""
    hit = _uniform.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    n = len(topo.gpus)
    kinds = set(topo.links.values())
    out = next(iter(kinds)) if len(kinds) == 1 and len(topo.links) == n * (n - 1) // 2 else None
    if len(_uniform) >= _CACHE_MAX:
        _uniform.clear()
    _uniform[id(topo)] = (topo, out)
    return out


_prints: dict[int, tuple[NodeTopology, tuple[object, ...]]] = {}


def fingerprint(topo: NodeTopology) -> tuple[object, ...]:
    """Equal for nodes whose GPU sets and links are equal: nodes of one model share cached
    answers, and twin candidates are skipped."""
    hit = _prints.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    kind = uniform_kind(topo)
    out = (topo.gpu_indices, kind) if kind is not None \
        else (topo.gpu_indices, tuple(sorted(topo.links.items())))
    if len(_prints) >= _CACHE_MAX:
        _prints.clear()
    _prints[id(topo)] = (topo, out)
    return out


def nvlink_domain_key(cluster: ClusterTopology, node: ClusterNode) -> tuple[str, ...] | None:
    """Identity of the node's multi-node NVLink domain, or None (no such level or label).

    Levels nest, so a domain is named by its label path from the coarsest level down to
    `nvlink_domain`: the same clique label under two racks is two domains.
    """
    if NVLINK_DOMAIN_LEVEL not in cluster.levels or not node.labels.get(NVLINK_DOMAIN_LEVEL):
        return None
    coarse_first = tuple(reversed(cluster.levels))
    upto = coarse_first[:coarse_first.index(NVLINK_DOMAIN_LEVEL) + 1]
    return tuple(node.labels.get(level, "") for level in upto)
