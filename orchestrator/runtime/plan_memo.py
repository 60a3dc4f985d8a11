"""The scheduler's memory of why each queued job waits, so it does not plan again for nothing.

Pure. A plan is a function of the job (its spec, attempt and the nodes it avoids — all
fixed while it stays queued, keyed here by id, attempt and last update), the cluster
snapshot and the link figures. While none of them changed, the answer is the Pending the job
already has: the tick skips the planner, so an idle scheduler's cost per tick does not grow
with the queue.

A snapshot's fingerprint is its value — nodes, labels, busy GPUs, free CPUs, Ray's counts and
each node's links — not its identity: the scheduler builds a new snapshot every tick. A
topology's links are hashed once per topology object (they are frozen).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from orchestrator.placement.gang_plan import Pending
from orchestrator.placement.snapshot import ClusterSnapshot
from orchestrator.topology.model import NodeTopology

JobKey = tuple[str, int, Any]


class PlanMemo:
    def __init__(self) -> None:
        self._waiting: dict[str, tuple[JobKey, Hashable, Pending]] = {}
        self._links: dict[int, tuple[NodeTopology, int]] = {}
        self._figures: Any = None

    def _topology_key(self, topo: NodeTopology) -> int:
        hit = self._links.get(id(topo))
        if hit is None or hit[0] is not topo:
            hit = (topo, hash((topo.gpu_indices, tuple(sorted(topo.links.items())))))
            self._links[id(topo)] = hit
        return hit[1]

    def fingerprint(self, snap: ClusterSnapshot) -> Hashable:
        nodes = tuple((n.name, n.node_id, tuple(sorted(n.busy_gpus)),
                       tuple(sorted(n.labels.items())), self._topology_key(n.topology))
                      for n in snap.cluster.nodes)
        ray_nodes = tuple((r.node_id, r.gpus, r.cpus, r.free_gpus, r.free_cpus)
                          for r in snap.ray_nodes)
        return (snap.cluster.levels, nodes, ray_nodes, tuple(sorted(snap.free_cpus.items())))

    def begin_pass(self, figures: Any) -> None:
        """Link figures changed (a new calibration): every job is planned again."""
        if figures != self._figures:
            self._waiting.clear()
            self._figures = figures
        if len(self._links) > 4096:  # topologies of nodes long gone
            self._links.clear()

    def still_waiting(self, job: JobKey, fingerprint: Hashable) -> Pending | None:
        """The job's Pending when it and the cluster are as they were when it got it."""
        hit = self._waiting.get(job[0])
        if hit is not None and hit[0] == job and hit[1] == fingerprint:
            return hit[2]
        return None

    def remember(self, job: JobKey, fingerprint: Hashable, pending: Pending) -> None:
        self._waiting[job[0]] = (job, fingerprint, pending)

    def keep_only(self, job_ids: Iterable[str]) -> None:
        """Forgets jobs no longer queued (placed, cancelled)."""
        keep = set(job_ids)
        for job_id in [j for j in self._waiting if j not in keep]:
            del self._waiting[job_id]
