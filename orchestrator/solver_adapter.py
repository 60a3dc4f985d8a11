"""GPU jobs: the topology-aware solver's answer as a gang plan or a "why pending". Pure module.

Solver failure reasons map to the three pending kinds users see:
  INFEASIBLE, TP_DOMAIN_TOO_SMALL → infeasible (never fits this cluster; waiting won't help)
  INSUFFICIENT_FREE               → waiting (for running jobs to release GPUs)
  FRAGMENTED                      → fragmented (enough GPUs in total, not in one domain)
"""

from __future__ import annotations

from typing import Any

from orchestrator.inventory import Inventory
from orchestrator.placement.links import LinkFigures
from orchestrator.placement.mesh import MeshShape
from orchestrator.placement.solver import Placement, solve_spec
from orchestrator.planning import GangPlan, Pending
from orchestrator.spec import JobSpec

_KIND = {"INFEASIBLE": "infeasible", "TP_DOMAIN_TOO_SMALL": "infeasible",
         "INSUFFICIENT_FREE": "waiting", "FRAGMENTED": "fragmented"}


def solve_gpu_plan(spec: JobSpec, inv: Inventory, *, avoid: set[str],
                   figures: LinkFigures | None = None) -> GangPlan | Pending:
    mesh = MeshShape.from_parallelism(spec.parallelism)
    # solve_spec passes the job's own model sizes, so the estimate is for this job.
    result = solve_spec(inv.cluster, spec, avoid=tuple(sorted(avoid)), figures=figures)
    if not isinstance(result, Placement):
        reason = getattr(result.reason, "value", str(result.reason))
        return Pending(_KIND.get(reason, "waiting"), result.message,
                       {"reason": reason, "needed_gpus": result.world_size,
                        "free_gpus": result.free_gpus, "total_gpus": inv.total_gpus,
                        "retryable": result.retryable})
    cpus = spec.resources.cpus_per_worker
    bundles = tuple(
        {"rank": r.rank, "node": r.node, "node_id": inv.cluster.node(r.node).node_id,
         "gpu": r.gpu, "coords": dict(r.coords), "resources": {"GPU": 1, "CPU": cpus}}
        for r in result.ranks)
    per_node = result.gpus_by_node()
    summary = f"{mesh.world_size} ranks on " + ", ".join(
        f"{n} GPUs {_compact(g)}" for n, g in per_node.items())
    solver: dict[str, Any] = {"level": result.level, "domain": list(result.domain),
                              "tp_within": result.tp_within, "relaxed": result.relaxed,
                              "notes": list(result.notes),
                              "estimate_s": getattr(result.estimate, "total_s", None)}
    return GangPlan(device="gpu", bundles=bundles, summary=summary, solver=solver)


def _compact(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)
