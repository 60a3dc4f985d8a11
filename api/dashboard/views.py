"""View models the dashboard's server-rendered parts need beyond the /v1 API.

Kept out of the route module so each piece is testable without HTTP: the communication
signature of a job (from the placement cost model), the cluster's level tree, and which job
holds which GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import yaml

from api.store_views import cluster_of
from orchestrator.mesh import MeshShape
from orchestrator.nodes.health_policy import NodeStatus
from orchestrator.placement.cost import ModelDims, communication_signature, estimate_slots
from orchestrator.placement.links import LinkModel
from orchestrator.spec import SpecKind, SpecValidationError
from orchestrator.store.records import JobRecord, NodeRecord, RankRecord, UserRecord
from orchestrator.text.ranges import format_ranges
from orchestrator.usercode.entrypoint import redact_env

log = logging.getLogger(__name__)


def spec_yaml(spec: dict[str, Any], *, viewer: UserRecord) -> str:
    """The spec as YAML, `entrypoint.env` values `***` to anyone but an admin."""
    shown = spec if viewer.is_admin else redact_env(spec)
    return yaml.safe_dump(shown, sort_keys=False, default_flow_style=False, allow_unicode=True)


def human_bytes(n: int) -> str:
    """`human_bytes(33554432) == '32.0 MiB'`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - loop always returns


def human_gb(gb: float | None) -> str:
    """Decimal gigabytes (the planner's unit) in a unit that fits: `human_gb(0.0004) ==
    '400 KB'`."""
    if gb is None:
        return "—"
    n = gb * 1e9
    if n < 1e6:
        return f"{n / 1e3:.0f} KB"
    if n < 1e9:
        return f"{n / 1e6:.1f} MB"
    return f"{gb:.1f} GB"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "—"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} µs"


@dataclass(frozen=True)
class CommRowView:
    dimension: str
    participants: int
    primitive: str
    bytes_per_call: str
    calls_per_step: int
    overlap: str
    est_time: str  # the dimension's estimated time per step (first row of a dimension only)
    bottleneck: str


@dataclass(frozen=True)
class CommView:
    rows: tuple[CommRowView, ...]
    note: str  # why there is no time estimate, or which links bound it
    total: str


def _estimate(mesh: MeshShape, dims: ModelDims, ranks: Sequence[RankRecord],
              nodes: Sequence[NodeRecord]) -> tuple[dict[str, Any], str]:
    """Per-dimension estimate from where the ranks run, or ({}, why not)."""
    if len(ranks) != mesh.world_size:
        return {}, "Estimated times appear once every rank is placed."
    used = {r.node for r in ranks}
    nodes = [n for n in nodes if n.name in used]  # a CPU-only head must not block it
    if not nodes or any(r.node is None or r.gpu is None for r in ranks):
        return {}, "No estimate: ranks run without GPUs or the cluster topology is unknown."
    try:
        cluster = cluster_of(nodes)
        slots = [(str(r.node), int(r.gpu or 0)) for r in sorted(ranks, key=lambda r: r.rank)]
        est = estimate_slots(slots, mesh=mesh, links=LinkModel(cluster), model=dims)
    except (ValueError, KeyError) as exc:
        log.info("no communication estimate: %s", exc)
        return {}, f"No estimate: {exc}"
    out = {d.dimension: d for d in est.dimensions}
    return out, (f"Estimated per step on the current placement: {human_seconds(est.total_s)} "
                 f"in total, {human_seconds(est.exposed_s)} not overlapped with compute.")


def comm_signature(job: JobRecord, *, ranks: Sequence[RankRecord],
                   nodes: Sequence[NodeRecord]) -> CommView | None:
    """The cost model's table for this job; None when its spec no longer parses."""
    try:
        spec = job.spec
    except SpecValidationError:
        return None
    if spec.kind is SpecKind.USER_CODE:
        return CommView(rows=(), total="—", note=(
            "This job runs its own code: meshyard does not know its model, so it estimates "
            "no communication. The collectives its ranks run are counted in the rank table "
            "and named in a hang's diagnosis."))
    mesh = MeshShape.from_parallelism(spec.parallelism)
    dims = ModelDims.from_spec(spec)
    rows = communication_signature(mesh, dims)
    est, note = _estimate(mesh, dims, ranks, nodes)
    views: list[CommRowView] = []
    shown: set[str] = set()
    for r in rows:
        d = est.get(r.dimension)
        first = r.dimension not in shown
        shown.add(r.dimension)
        views.append(CommRowView(
            dimension=r.dimension, participants=r.participants, primitive=r.primitive,
            bytes_per_call=human_bytes(r.bytes_per_call), calls_per_step=r.calls_per_step,
            overlap=f"{r.overlap:.0%}",
            est_time=human_seconds(d.seconds) if (d is not None and first) else "",
            bottleneck=(f"{d.bottleneck} ({d.bottleneck_gbs:.0f} GB/s)"
                        if (d is not None and first) else "")))
    total = human_seconds(sum(d.seconds for d in est.values())) if est else "—"
    if not rows:
        note = "A single rank: no communication."
    return CommView(rows=tuple(views), note=note, total=total)


@dataclass
class TreeNode:
    """One label value at one level, with its children (finer levels) or its nodes."""

    level: str
    value: str
    children: list[TreeNode] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


def level_tree(nodes: Sequence[NodeRecord], levels: Sequence[str]) -> TreeNode:
    """Coarsest level at the top: root → spine → leaf → node names."""
    root = TreeNode(level="cluster", value="cluster")
    for n in nodes:
        at = root
        for level in reversed(levels):
            value = str(n.labels.get(level, "")) or "(none)"
            nxt = next((c for c in at.children if c.value == value and c.level == level), None)
            if nxt is None:
                nxt = TreeNode(level=level, value=value)
                at.children.append(nxt)
            at = nxt
        at.nodes.append(n.name)
    return root


@dataclass(frozen=True)
class GpuUse:
    gpu: int
    job_id: str | None  # None: free (or held by a job the viewer may not see: see `hidden`)
    job_name: str
    rank: int | None
    hidden: bool = False


@dataclass(frozen=True)
class Holder:
    """One job's share of a node: which GPUs and ranks, as compact ranges ('0–3, 6'), and
    the CPUs its ranks reserved there."""

    job_id: str | None
    job_name: str
    gpus: str
    ranks: str
    cpus: float = 0.0


@dataclass(frozen=True)
class CpuHold:
    """The CPUs one job's ranks reserved on one node (its attempt's placement)."""

    job_id: str | None  # None: a job the viewer may not see
    job_name: str
    cpus: float
    ranks: tuple[int, ...]


def cpu_usage(jobs: Iterable[tuple[JobRecord, Mapping[str, Any] | None]], *,
              viewer: UserRecord) -> dict[str, list[CpuHold]]:
    """Node name -> the CPUs each active job reserved there, from each job's current
    attempt's placement (`GangPlan.to_dict()`: a bundle per rank, with its CPUs)."""
    out: dict[str, dict[str | None, CpuHold]] = {}
    for job, placement in jobs:
        visible = viewer.sees_all_jobs or job.owner == viewer.name
        for b in (placement or {}).get("bundles", ()) or ():
            cpus = float((b.get("resources") or {}).get("CPU", 0.0) or 0.0)
            node = b.get("node")
            if not node or cpus <= 0:
                continue
            key = job.id if visible else f"hidden:{job.id}"
            was = out.setdefault(str(node), {}).get(key)
            rank = b.get("rank")
            ranks = (was.ranks if was else ()) + ((int(rank),) if visible and rank is not None
                                                   else ())
            out[str(node)][key] = CpuHold(
                job_id=job.id if visible else None,
                job_name=job.name if visible else "another user's job",
                cpus=(was.cpus if was else 0.0) + cpus, ranks=ranks)
    return {node: list(by_job.values()) for node, by_job in out.items()}


@dataclass(frozen=True)
class NodeView:
    name: str
    alive: bool
    labels: dict[str, Any]
    gpus: tuple[GpuUse, ...]
    cpus: float
    used: int
    nvlink_pairs: int
    holders: tuple[Holder, ...] = ()
    cpus_used: float = 0.0  # reserved by the active jobs' ranks


def ranges(values: Iterable[int]) -> str:
    """`ranges([0, 1, 2, 3, 6]) == '0–3, 6'`."""
    return format_ranges(values, dash="–", sep=", ")


def _holders(gpus: Sequence[GpuUse], cpus: Sequence[CpuHold] = ()) -> tuple[Holder, ...]:
    by_job: dict[tuple[str | None, str], list[GpuUse]] = {}
    for g in gpus:
        if g.job_id is not None or g.hidden:
            by_job.setdefault((g.job_id, g.job_name), []).append(g)
    cpu_of = {(c.job_id, c.job_name): c for c in cpus}
    out = [Holder(job_id=jid, job_name=name, gpus=ranges(g.gpu for g in held),
                  ranks=ranges(g.rank for g in held if g.rank is not None),
                  cpus=cpu_of[(jid, name)].cpus if (jid, name) in cpu_of else 0.0)
           for (jid, name), held in by_job.items()]
    # Jobs with CPU ranks only here (a CPU cluster, or a job's CPU-only ranks).
    out += [Holder(job_id=c.job_id, job_name=c.job_name, gpus="", ranks=ranges(c.ranks),
                   cpus=c.cpus) for c in cpus if (c.job_id, c.job_name) not in by_job]
    return tuple(out)


def _nvlink_pairs(topology: dict[str, Any]) -> int:
    return sum(1 for link in topology.get("links", []) or []
               if str(link.get("type", "")).startswith("NV"))


class HeldGpu(Protocol):
    """A GPU a job holds: `placement.holds.GpuHold` (or a stored rank)."""

    @property
    def node(self) -> str | None: ...
    @property
    def gpu(self) -> int | None: ...
    @property
    def rank(self) -> int | None: ...


def gpu_usage(jobs: Iterable[tuple[JobRecord, Sequence[HeldGpu]]], *,
              viewer: UserRecord) -> dict[tuple[str, int], GpuUse]:
    """(node, gpu) -> who holds it, from what the active jobs hold (`placement.holds`)."""
    out: dict[tuple[str, int], GpuUse] = {}
    for job, held in jobs:
        visible = viewer.sees_all_jobs or job.owner == viewer.name
        for r in held:
            if r.node is None or r.gpu is None:
                continue
            out[(r.node, r.gpu)] = GpuUse(gpu=r.gpu, job_id=job.id if visible else None,
                                          job_name=job.name if visible else "another user's job",
                                          rank=r.rank if visible else None, hidden=not visible)
    return out


@dataclass(frozen=True)
class ClusterNow:
    """The cluster page's live part: every node with who holds its GPUs, and the totals of
    the live nodes."""

    nodes: list[NodeView]
    total: int
    used: int
    alive: int
    cpus_total: float = 0.0
    cpus_used: float = 0.0

    @property
    def summary(self) -> str:
        """'2 of 8 GPUs in use on 2 live nodes · 3 of 64 CPUs reserved', or on a cluster
        without GPUs '3 of 64 CPUs reserved on 2 live nodes'."""
        cpus = f"{self.cpus_used:g} of {self.cpus_total:g} CPUs reserved"
        if not self.total:
            return f"{cpus} on {self.alive} live nodes"
        return f"{self.used} of {self.total} GPUs in use on {self.alive} live nodes · {cpus}"


def cluster_now(nodes: Sequence[NodeRecord], usage: dict[tuple[str, int], GpuUse],
                cpus: Mapping[str, Sequence[CpuHold]] | None = None) -> ClusterNow:
    views = node_views(nodes, usage, cpus)
    live = [n for n in views if n.alive]
    return ClusterNow(nodes=views, total=sum(len(n.gpus) for n in live),
                      used=sum(n.used for n in live), alive=len(live),
                      cpus_total=sum(n.cpus for n in live),
                      cpus_used=round(sum(n.cpus_used for n in live), 3))


def node_views(nodes: Sequence[NodeRecord], usage: dict[tuple[str, int], GpuUse],
               cpus: Mapping[str, Sequence[CpuHold]] | None = None) -> list[NodeView]:
    views = []
    for n in nodes:
        count = max(n.gpus, len(n.topology.get("gpus", []) or []))
        gpus = tuple(usage.get((n.name, g), GpuUse(gpu=g, job_id=None, job_name="", rank=None))
                     for g in range(count))
        used = sum(1 for g in gpus if g.job_id is not None or g.hidden)
        held = (cpus or {}).get(n.name, ())
        views.append(NodeView(name=n.name, alive=n.alive, labels=dict(n.labels), gpus=gpus,
                              cpus=n.cpus, used=used, nvlink_pairs=_nvlink_pairs(n.topology),
                              holders=_holders(gpus, held),
                              cpus_used=round(sum(c.cpus for c in held), 3)))
    return views


@dataclass(frozen=True)
class HealthCell:
    """The cluster page's health column for one node: state, why, until when, and the jobs
    whose diagnoses put it there (links)."""

    state: str
    reason: str
    until: str
    gpus: str
    diagnoses: tuple[tuple[str, int], ...]  # (job id, diagnosis id)


def health_cell(s: NodeStatus) -> HealthCell:
    until = "permanent" if s.permanent else (
        f"until {datetime.fromtimestamp(s.until, UTC):%H:%M:%S} UTC" if s.until else "")
    diags = tuple(dict.fromkeys((e.job_id, e.diagnosis_id) for e in s.evidence
                                if e.job_id and e.diagnosis_id is not None))[-3:]
    return HealthCell(state=s.state.value, reason=s.reason[:200], until=until,
                      gpus=",".join(map(str, s.cordoned_gpus)),
                      diagnoses=diags)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PoolNodeView:
    node: str       # the node's name when known, else its Ray node id
    idle: int
    leased: int
    starting: int
    idle_mib: float


@dataclass(frozen=True)
class PoolView:
    size: int
    draining: bool
    nodes: list[PoolNodeView]
    idle_mib: float


def warm_pool_view(status: dict[str, Any] | None,
                   nodes: Sequence[NodeRecord]) -> PoolView | None:
    """The warm pool section of the cluster page from Runtime.pool_status (None: no pool)."""
    if not status:
        return None
    names = {n.node_id: n.name for n in nodes if n.node_id}
    rows = [PoolNodeView(node=names.get(node_id, node_id[:12]), idle=int(r.get("idle", 0)),
                         leased=int(r.get("leased", 0)), starting=int(r.get("starting", 0)),
                         idle_mib=float(r.get("idle_rss_bytes", 0)) / 2**20)
            for node_id, r in sorted((status.get("nodes") or {}).items())]
    return PoolView(size=int(status.get("size", 0)), draining=bool(status.get("draining")),
                    nodes=sorted(rows, key=lambda r: r.node),
                    idle_mib=sum(r.idle_mib for r in rows))
