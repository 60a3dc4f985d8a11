"""From a queued job and the inventory to a gang plan (bundles) or a numbered pending reason.

GPU jobs go through the topology-aware solver (orchestrator/placement/solver.py). CPU jobs
(device cpu, or device auto on a cluster without GPUs) are packed here: consecutive ranks
share a node, nodes with the most free CPUs first. Pure module.

A "why pending" reason is a dict the API shows as-is:
  {"kind": "infeasible" | "waiting" | "fragmented", "message": "...", numbers...}
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.mesh import MeshShape
from orchestrator.placement.links import LinkFigures
from orchestrator.placement.snapshot import Inventory
from orchestrator.placement.solver import Placement, solve_spec
from orchestrator.spec import Device, JobSpec


@dataclass(frozen=True)
class GangPlan:
    device: str  # "gpu" | "cpu"
    bundles: tuple[dict[str, Any], ...]  # per rank: rank, node, node_id, gpu, coords, resources
    summary: str
    solver: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "bundles": [dict(b) for b in self.bundles],
                "summary": self.summary, "solver": self.solver}

    def gpus_by_node(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for b in self.bundles:
            if b.get("gpu") is not None:
                out.setdefault(b["node"], []).append(b["gpu"])
        return out

    def cpus_by_node(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in self.bundles:
            out[b["node"]] = out.get(b["node"], 0.0) + b["resources"].get("CPU", 0.0)
        return out


@dataclass(frozen=True)
class Pending:
    kind: str  # infeasible | waiting | fragmented
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, **self.numbers}


def wants_gpus(spec: JobSpec, inv: Inventory) -> bool:
    """device auto uses GPUs when the cluster has any (and waits for them when busy)."""
    dev = spec.resources.device
    if dev == Device.CPU or spec.resources.gpus_per_worker == 0:
        return False
    return dev == Device.CUDA or inv.total_gpus > 0


def plan_job(spec: JobSpec, inv: Inventory, *, avoid: Iterable[str] = (),
             figures: Any = None) -> GangPlan | Pending:
    avoid_set = set(avoid) | set(spec.placement.avoid_nodes)
    if wants_gpus(spec, inv):
        return solve_gpu_plan(spec, inv, avoid=avoid_set, figures=figures)
    return _plan_cpu(spec, inv, avoid=avoid_set)


def _plan_cpu(spec: JobSpec, inv: Inventory, *, avoid: set[str]) -> GangPlan | Pending:
    world, per = spec.world_size, spec.resources.cpus_per_worker
    nodes = [n for n in inv.cluster.nodes if n.name not in avoid and n.node_id not in avoid]
    total = {n.name: _node_cpus(inv, n.node_id) for n in nodes}
    free = {n.name: inv.free_cpus.get(n.name, 0.0) for n in nodes}
    need = world * per
    fits_total = sum(int(total[n] // per + 1e-9) for n in total)
    if fits_total < world:
        return Pending("infeasible", f"needs {world} workers x {per:g} CPU = {need:g} CPUs; the "
                       f"cluster has {sum(total.values()):g} CPUs"
                       f"{' outside avoided nodes' if avoid else ''} and never fits",
                       {"needed_cpus": need, "total_cpus": sum(total.values())})
    slots = {n: int(free[n] // per + 1e-9) for n in free}
    if sum(slots.values()) < world:
        return Pending("waiting", f"needs {need:g} CPUs; {sum(free.values()):g} free now "
                       "(waiting for running jobs)",
                       {"needed_cpus": need, "free_cpus": sum(free.values()),
                        "total_cpus": sum(total.values())})
    bundles: list[dict[str, Any]] = []
    rank = 0
    mesh = MeshShape.from_parallelism(spec.parallelism)
    for n in sorted(nodes, key=lambda n: (-slots[n.name], n.name)):
        for _ in range(slots[n.name]):
            if rank == world:
                break
            bundles.append({"rank": rank, "node": n.name, "node_id": n.node_id, "gpu": None,
                            "coords": mesh.coords(rank), "resources": {"CPU": per}})
            rank += 1
    used = sorted({b["node"] for b in bundles})
    return GangPlan(device="cpu", bundles=tuple(bundles),
                    summary=f"{world} CPU ranks on {', '.join(used)}")


def _node_cpus(inv: Inventory, node_id: str | None) -> float:
    return next((r.cpus for r in inv.ray_nodes if r.node_id == node_id), 0.0)


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
