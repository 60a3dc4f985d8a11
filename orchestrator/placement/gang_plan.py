"""From a queued job and the cluster snapshot to a gang plan (bundles) or why it must wait.

GPU jobs go through the topology-aware solver (orchestrator/placement/solver.py); its typed
answer is kept (`GangPlan.placement`, `Pending.failure`). CPU jobs (device cpu, or device auto
on a cluster without GPUs) are packed here: consecutive ranks share a node, nodes with the most
free CPUs first. Pure module.

Solver failures map to the pending kinds users see:
  INFEASIBLE, TP_DOMAIN_TOO_SMALL -> infeasible (never fits this cluster; waiting won't help)
  INSUFFICIENT_FREE               -> waiting (for running jobs to release GPUs)
  FRAGMENTED                      -> fragmented (enough GPUs in total, not in one domain)
A job that is infeasible only because nodes are cordoned waits for them instead
(`wait_for_cordons`: kind cordoned, naming each node, its reason and when its cordon ends).
The store keeps `Pending.to_dict()` as the job's pending reason, which the API shows as is:
  {"kind": "infeasible" | "waiting" | "fragmented" | "cordoned" | "placement_timeout",
   "message": ..., numbers}
(the scheduler's other kinds: "quota", and "reserved" with a `reservation` object, for the
job GPUs are held back for: orchestrator/scheduling/reservation.py)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from orchestrator.mesh import MeshShape
from orchestrator.nodes.health_policy import Cordon
from orchestrator.placement.failure import FailureReason, PlacementFailure
from orchestrator.placement.links import LinkFigures
from orchestrator.placement.snapshot import ClusterSnapshot
from orchestrator.placement.solver import Placement, solve_spec
from orchestrator.spec import Device, JobSpec


class PlanDevice(StrEnum):
    GPU = "gpu"
    CPU = "cpu"


@dataclass(frozen=True)
class Bundle:
    """One rank's share of the gang reservation, pinned to a node (Ray node id)."""

    rank: int
    node: str  # node name in the topology
    node_id: str | None  # Ray node id the bundle is pinned to
    gpu: int | None  # planned local GPU index (None: a CPU rank)
    coords: dict[str, int]
    cpus: float

    @property
    def resources(self) -> dict[str, float]:
        """The placement-group bundle: one GPU (when planned) and the rank's CPUs."""
        return {"CPU": self.cpus} if self.gpu is None else {"GPU": 1, "CPU": self.cpus}

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "node_id": self.node_id, "gpu": self.gpu,
                "coords": dict(self.coords), "resources": self.resources}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Bundle:
        return cls(rank=int(d["rank"]), node=str(d["node"]), node_id=d.get("node_id"),
                   gpu=None if d.get("gpu") is None else int(d["gpu"]),
                   coords=dict(d.get("coords") or {}),
                   cpus=float((d.get("resources") or {}).get("CPU", 0.0)))


@dataclass(frozen=True)
class GangPlan:
    device: PlanDevice
    bundles: tuple[Bundle, ...]  # ordered by planned rank
    summary: str
    placement: Placement | None = None  # the solver's answer (GPU jobs)

    def solver_summary(self) -> dict[str, Any]:
        p = self.placement
        if p is None:
            return {}
        return {"level": p.level, "domain": list(p.domain), "tp_within": p.tp_within,
                "relaxed": p.relaxed, "notes": list(p.notes), "estimate_s": p.estimate.total_s}

    def to_dict(self) -> dict[str, Any]:
        """The attempt's stored placement (GET /v1/jobs/{id}/attempts shows it)."""
        return {"device": self.device.value, "bundles": [b.to_dict() for b in self.bundles],
                "summary": self.summary, "solver": self.solver_summary()}

    def gpus_by_node(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for b in self.bundles:
            if b.gpu is not None:
                out.setdefault(b.node, []).append(b.gpu)
        return out

    def cpus_by_node(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in self.bundles:
            out[b.node] = out.get(b.node, 0.0) + b.cpus
        return out


class PendingKind(StrEnum):
    INFEASIBLE = "infeasible"
    WAITING = "waiting"
    FRAGMENTED = "fragmented"
    PLACEMENT_TIMEOUT = "placement_timeout"
    CORDONED = "cordoned"  # fits the cluster only with cordoned nodes: waits for them
    QUOTA = "quota"  # the owner's GPU / CPU quota is full (admission/quotas.py)
    RESERVED = "reserved"  # first in line: GPUs are held back for it (scheduling/reservation.py)


_KIND = {FailureReason.INFEASIBLE: PendingKind.INFEASIBLE,
         FailureReason.TP_DOMAIN_TOO_SMALL: PendingKind.INFEASIBLE,
         FailureReason.INSUFFICIENT_FREE: PendingKind.WAITING,
         FailureReason.FRAGMENTED: PendingKind.FRAGMENTED}


@dataclass(frozen=True)
class Pending:
    """Why a job is not placed now. GPU jobs carry the solver's `failure`; CPU jobs the CPU
    numbers; a placement timeout how long Ray was given; a wait for cordons the cordons."""

    kind: PendingKind
    message: str
    failure: PlacementFailure | None = None
    total_gpus: int | None = None
    cpus: Mapping[str, float] = field(default_factory=dict)  # needed / free / total
    waited_s: float | None = None
    cordons: tuple[Cordon, ...] = ()

    @classmethod
    def from_failure(cls, failure: PlacementFailure, *, total_gpus: int) -> Pending:
        return cls(_KIND[failure.reason], failure.message, failure=failure,
                   total_gpus=total_gpus)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "message": self.message}
        f = self.failure
        if f is not None:
            out.update(reason=f.reason.value, needed_gpus=f.world_size, free_gpus=f.free_gpus,
                       total_gpus=self.total_gpus, retryable=f.retryable)
        out.update({f"{k}_cpus": v for k, v in self.cpus.items()})
        if self.kind == PendingKind.PLACEMENT_TIMEOUT:
            out["waited_s"] = self.waited_s
        if self.cordons:
            out["cordoned_nodes"] = [c.to_dict() for c in self.cordons]
        return out


def wait_for_cordons(infeasible: Pending, *, with_cordoned: GangPlan | Pending,
                     cordons: Sequence[Cordon]) -> Pending:
    """What a job told `infeasible` with the cordoned nodes avoided waits for, given its plan
    with them (`with_cordoned`): the cordons, when it fits the cluster with them (a cordon
    ends, or an admin lifts it, so the job is not infeasible and its placement.timeout_s does
    not run); else `infeasible` as it is.

    >>> c = Cordon(node="n1", reason="cordoned by admin: maintenance", until=1_800_000_000.0)
    >>> wait_for_cordons(Pending(PendingKind.INFEASIBLE, "never fits"), cordons=[c],
    ...                  with_cordoned=Pending(PendingKind.WAITING, "busy")).message
    'waiting for cordoned node n1 (cordoned by admin: maintenance) until 2027-01-15 08:00 UTC: \
the job fits the cluster only with it; `meshyard node uncordon NAME` lifts a cordon early'
    """
    fits = not (isinstance(with_cordoned, Pending)
                and with_cordoned.kind == PendingKind.INFEASIBLE)
    if not cordons or not fits:
        return infeasible
    nodes = "; ".join(f"{c.node} ({c.reason}) " + (
        f"until {datetime.fromtimestamp(c.until, UTC):%Y-%m-%d %H:%M} UTC"
        if c.until is not None else "permanently, until an admin uncordons it")
        for c in cordons)
    them = "it" if len(cordons) == 1 else "them"
    return Pending(PendingKind.CORDONED,
                   f"waiting for cordoned node{'s' if len(cordons) > 1 else ''} {nodes}: the "
                   f"job fits the cluster only with {them}; `meshyard node uncordon NAME` "
                   "lifts a cordon early", cpus=infeasible.cpus, cordons=tuple(cordons))


def wants_gpus(spec: JobSpec, snap: ClusterSnapshot) -> bool:
    """device auto uses GPUs when the cluster has any (and waits for them when busy)."""
    dev = spec.resources.device
    if dev == Device.CPU or spec.resources.gpus_per_worker == 0:
        return False
    return dev == Device.CUDA or snap.total_gpus > 0


def plan_job(spec: JobSpec, snap: ClusterSnapshot, *, avoid: Iterable[str] = (),
             figures: LinkFigures | None = None) -> GangPlan | Pending:
    avoid_set = set(avoid) | set(spec.placement.avoid_nodes)
    if wants_gpus(spec, snap):
        return _plan_gpu(spec, snap, avoid=avoid_set, figures=figures)
    return _plan_cpu(spec, snap, avoid=avoid_set)


def _plan_cpu(spec: JobSpec, snap: ClusterSnapshot, *, avoid: set[str]) -> GangPlan | Pending:
    world, per = spec.world_size, spec.resources.cpus_per_worker
    nodes = [n for n in snap.cluster.nodes if n.name not in avoid and n.node_id not in avoid]
    total = {n.name: _node_cpus(snap, n.node_id) for n in nodes}
    free = {n.name: snap.free_cpus.get(n.name, 0.0) for n in nodes}
    need = world * per
    fits_total = sum(int(total[n] // per + 1e-9) for n in total)
    if fits_total < world:
        return Pending(PendingKind.INFEASIBLE,
                       f"needs {world} workers x {per:g} CPU = {need:g} CPUs; the cluster has "
                       f"{sum(total.values()):g} CPUs"
                       f"{' outside avoided nodes' if avoid else ''} and never fits",
                       cpus={"needed": need, "total": sum(total.values())})
    slots = {n: int(free[n] // per + 1e-9) for n in free}
    if sum(slots.values()) < world:
        return Pending(PendingKind.WAITING, f"needs {need:g} CPUs; {sum(free.values()):g} free "
                       "now (waiting for running jobs)",
                       cpus={"needed": need, "free": sum(free.values()),
                             "total": sum(total.values())})
    bundles: list[Bundle] = []
    mesh = MeshShape.from_parallelism(spec.parallelism)
    for n in sorted(nodes, key=lambda n: (-slots[n.name], n.name)):
        for _ in range(slots[n.name]):
            if len(bundles) == world:
                break
            rank = len(bundles)
            bundles.append(Bundle(rank=rank, node=n.name, node_id=n.node_id, gpu=None,
                                  coords=mesh.coords(rank), cpus=per))
    used = sorted({b.node for b in bundles})
    return GangPlan(device=PlanDevice.CPU, bundles=tuple(bundles),
                    summary=f"{world} CPU ranks on {', '.join(used)}")


def _node_cpus(snap: ClusterSnapshot, node_id: str | None) -> float:
    return next((r.cpus for r in snap.ray_nodes if r.node_id == node_id), 0.0)


def _plan_gpu(spec: JobSpec, snap: ClusterSnapshot, *, avoid: set[str],
              figures: LinkFigures | None = None) -> GangPlan | Pending:
    # solve_spec passes the job's own model sizes, so the estimate is for this job.
    result = solve_spec(snap.cluster, spec, avoid=tuple(sorted(avoid)), figures=figures)
    if isinstance(result, PlacementFailure):
        return Pending.from_failure(result, total_gpus=snap.total_gpus)
    cpus = spec.resources.cpus_per_worker
    bundles = tuple(Bundle(rank=r.rank, node=r.node, node_id=snap.cluster.node(r.node).node_id,
                           gpu=r.gpu, coords=dict(r.coords), cpus=cpus) for r in result.ranks)
    summary = f"{result.mesh.world_size} ranks on " + ", ".join(
        f"{n} GPUs {','.join(map(str, g))}" for n, g in result.gpus_by_node().items())
    return GangPlan(device=PlanDevice.GPU, bundles=bundles, summary=summary, placement=result)
