"""What routes compute from the store, written once: the cluster now (`cluster_from_store`,
the planner's and the dashboard's one view of it), node statuses, a job's goodput.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from orchestrator.jobs.goodput import Goodput, from_records
from orchestrator.nodes.health_policy import NodeStatus, node_statuses
from orchestrator.placement.holds import busy_gpus, gpu_holds
from orchestrator.placement.snapshot import cluster_from_records
from orchestrator.settings import Settings
from orchestrator.store.records import JobRecord, NodeRecord
from orchestrator.store.repo import Store
from orchestrator.topology.declared import load_cluster_file
from orchestrator.topology.model import ClusterTopology


def cluster_levels(nodes: Sequence[NodeRecord], settings: Settings | None = None
                   ) -> tuple[str, ...]:
    """Label levels above the node, finest first: the declared cluster file's when the server
    has one, else a stored `levels` list if the runtime wrote one into a node's topology, else
    the label keys in the order the nodes list them."""
    if settings is not None and settings.cluster_file is not None \
            and settings.cluster_file.exists():
        return load_cluster_file(settings.cluster_file).levels
    for n in nodes:
        stored = n.topology.get("levels") if isinstance(n.topology, dict) else None
        if isinstance(stored, list) and all(isinstance(x, str) for x in stored):
            return tuple(stored)
    seen: dict[str, None] = {}
    for n in nodes:
        for key in n.labels:
            if "/" not in key and key != "node":  # ray.io/node-id and friends are not levels
                seen.setdefault(str(key), None)
    return tuple(seen)


def cluster_from_store(store: Store, settings: Settings | None = None, *,
                       nodes: Sequence[NodeRecord] | None = None,
                       busy: bool = True) -> ClusterTopology:
    """The cluster now as the store knows it: alive GPU nodes with their topology, busy where
    active jobs hold GPUs (`busy=False`: all free, for an estimate on a placement already
    made); `nodes` narrows it to those records."""
    nodes = store.list_nodes() if nodes is None else nodes
    held = busy_gpus([h for _, hs in gpu_holds(store) for h in hs]) if busy else None
    return cluster_of(nodes, settings, busy=held)


def cluster_of(nodes: Sequence[NodeRecord], settings: Settings | None = None, *,
               busy: Mapping[str, Iterable[int]] | None = None) -> ClusterTopology:
    """The alive GPU nodes among `nodes` with their stored topology, at `cluster_levels`."""
    return cluster_from_records(nodes, levels=cluster_levels(nodes, settings), busy=busy)


def statuses(store: Store, settings: Settings) -> list[NodeStatus]:
    """Every known node's health now (ledger entry and liveness, under the health policy)."""
    return node_statuses(nodes=[(n.name, n.node_id, n.alive) for n in store.list_nodes()],
                         entries=store.list_node_health(), now=time.time(),
                         policy=settings.health_policy())


def job_goodput(job: JobRecord, store: Store) -> Goodput:
    """The job's goodput ledger now (orchestrator/jobs/goodput.py)."""
    return from_records(events=store.list_events(job.id, limit=10_000),
                        metrics=store.list_metrics(job.id, rank=0, limit=100_000),
                        diagnoses=store.list_diagnoses(job.id), now=time.time(),
                        ranks=store.rank_zero_rows(job.id))
