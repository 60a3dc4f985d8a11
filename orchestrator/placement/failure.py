"""Why a job does not fit: a typed reason and a message a person can act on.

Pure module. The runtime shows these as the "why pending" line, so the reasons separate what
waiting cures from what it does not:

  INFEASIBLE           never fits this cluster, even with every GPU free (too few GPUs, or TP
                       groups that cannot all be packed into NVLink domains / nodes)
  TP_DOMAIN_TOO_SMALL  never fits: no NVLink domain (or node) in the cluster has tp GPUs
  INSUFFICIENT_FREE    fits an empty cluster; fewer GPUs are free now than the job needs
  FRAGMENTED           enough GPUs are free in total, but not enough inside single domains
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator.mesh import MeshShape
from orchestrator.placement.domains import Packing, build_tree, free_of, tp_domains
from orchestrator.placement.nodeinfo import nvlink_domain_key
from orchestrator.spec import TopologyLevel
from orchestrator.topology.model import ClusterTopology


class FailureReason(StrEnum):
    INFEASIBLE = "INFEASIBLE"
    TP_DOMAIN_TOO_SMALL = "TP_DOMAIN_TOO_SMALL"
    INSUFFICIENT_FREE = "INSUFFICIENT_FREE"
    FRAGMENTED = "FRAGMENTED"


@dataclass(frozen=True)
class PlacementFailure:
    reason: FailureReason
    message: str
    world_size: int
    free_gpus: int

    @property
    def retryable(self) -> bool:
        """True when running jobs finishing can make the job fit (keep it queued)."""
        return self.reason in (FailureReason.INSUFFICIENT_FREE, FailureReason.FRAGMENTED)

    def as_dict(self) -> dict[str, Any]:
        return {"reason": self.reason.value, "message": self.message,
                "retryable": self.retryable}


def _largest_domain(cluster: ClusterTopology, packing: Packing, *, avoid: frozenset[str],
                    ignore_busy: bool) -> tuple[int, str]:
    """(GPU count, where) of the largest TP domain, free GPUs only unless ignore_busy."""
    best = (0, "nowhere")
    pools: dict[str, int] = {}
    for node in sorted(cluster.nodes, key=lambda n: n.name):
        if node.name in avoid or node.node_id in avoid:
            continue
        free = free_of(node, ignore_busy=ignore_busy)
        key = nvlink_domain_key(cluster, node)
        if packing.pools and key:
            pools["/".join(key)] = pools.get("/".join(key), 0) + len(free)
            continue
        for dom in tp_domains(node, free, packing.tp_within):
            if len(dom) > best[0]:
                best = (len(dom), node.name)
    for label, size in sorted(pools.items()):
        if size > best[0]:
            best = (size, f"NVLink domain {label}")
    return best


def explain(cluster: ClusterTopology, mesh: MeshShape, *, packing: Packing,
            avoid: frozenset[str] = frozenset()) -> PlacementFailure:
    usable = [n for n in cluster.nodes if n.name not in avoid and n.node_id not in avoid]
    world, tp, groups = mesh.world_size, mesh.tp, mesh.n_tp_groups
    total = sum(len(n.topology.gpus) for n in usable)
    free = sum(len(n.free_gpus) for n in usable)
    word = "NVLink domain" if packing.tp_within == TopologyLevel.NVLINK_DOMAIN else "node"
    skipped = f" outside the {len(cluster.nodes) - len(usable)} avoided nodes" \
        if len(usable) < len(cluster.nodes) else ""

    def fail(reason: FailureReason, message: str) -> PlacementFailure:
        return PlacementFailure(reason=reason, message=message, world_size=world, free_gpus=free)

    if total < world:
        return fail(FailureReason.INFEASIBLE,
                    f"the job needs {world} GPUs ({_degrees(mesh)}) but the cluster has {total}"
                    f"{skipped}; lower the parallel degrees or add nodes")
    ideal_size, ideal_where = _largest_domain(cluster, packing, avoid=avoid, ignore_busy=True)
    if ideal_size < tp:
        hint = "" if packing.tp_within == TopologyLevel.NODE else ", or set tp_within=node"
        return fail(FailureReason.TP_DOMAIN_TOO_SMALL,
                    f"each TP group needs {tp} GPUs inside one {word}, but the largest {word} "
                    f"in this cluster has {ideal_size} ({ideal_where}); use tp <= {ideal_size}"
                    f"{hint}")
    ideal_cap = build_tree(cluster, packing, avoid=avoid, ignore_busy=True).cap
    if ideal_cap < groups:
        return fail(FailureReason.INFEASIBLE,
                    f"even with every GPU free the cluster{skipped} holds only {ideal_cap} TP "
                    f"groups of {tp} GPUs inside one {word}; the job needs {groups}. Lower tp "
                    f"or the other degrees")
    if free < world:
        return fail(FailureReason.INSUFFICIENT_FREE,
                    f"the job needs {world} GPUs; {free} are free now ({total - free} busy"
                    f"{skipped}). It starts when running jobs release {world - free} more")
    size, where = _largest_domain(cluster, packing, avoid=avoid, ignore_busy=False)
    now_cap = build_tree(cluster, packing, avoid=avoid).cap
    lead = f"each of the {groups} TP groups needs" if groups > 1 else "the TP group needs"
    return fail(FailureReason.FRAGMENTED,
                f"{lead} {tp} GPUs inside one {word}; the largest free {word} has {size}, on "
                f"{where} ({now_cap} of {groups} groups fit now although {free} GPUs are free). "
                f"It starts when running jobs free whole {word}s; mode=preferred (--preferred) "
                f"places it now across domains")


def _degrees(mesh: MeshShape) -> str:
    return " x ".join(f"{k}={v}" for k, v in mesh.as_dict().items())
