"""Ray's view of the cluster, joined with its topology: for the scheduler and for the store.

- `read_ray_nodes()`: the alive Ray nodes with their totals, free resources and labels.
- `TopologySource`: where GPU links come from. The declared file when the settings name one;
  otherwise discovery (`nvidia-smi topo -m`, NVML, sysfs InfiniBand) run once on every GPU node
  by a task pinned to it, again whenever the set of GPU nodes changes. A cluster without GPUs
  needs no topology and runs no discovery.
- `register_nodes()`: writes the live nodes and their topology into the store (GET
  /v1/cluster, the dashboard, POST /v1/plans read them there).
- `nodes_changed()`: whether Ray's live nodes differ from those the store holds alive (one GCS
  call and one query: the runtime looks every few seconds and registers on a change).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.placement.snapshot import RayNode, build_snapshot, newest_per_name
from orchestrator.store.repo import Store
from orchestrator.topology.declared import load_cluster_file
from orchestrator.topology.discovery import cluster_from_discovery, discover_local_node
from orchestrator.topology.model import ClusterTopology
from orchestrator.topology.serialize import node_topology_to_dict

log = logging.getLogger("meshyard.runtime")


# When this process first saw each Ray node id (newest_per_name: a restarted host's new node)
_FIRST_SEEN: dict[str, float] = {}
_WARNED: set[tuple[str, ...]] = set()


def read_ray_nodes(store: Store | None = None) -> list[RayNode]:
    """Alive Ray nodes with totals, free resources and labels (ray must be initialised), one
    per node name (`newest_per_name`; `store`, read only when two nodes share a name: the
    node id it holds for the name breaks a tie)."""
    from ray._private.state import state  # the per-node view has no public API in 2.x

    avail = state.available_resources_per_node()
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res, free = n.get("Resources", {}), avail.get(n["NodeID"], {})
        out.append(RayNode(
            node_id=n["NodeID"], ip=n.get("NodeManagerAddress", ""),
            labels={k: v for k, v in (n.get("Labels") or {}).items()},
            gpus=int(res.get("GPU", 0)), cpus=float(res.get("CPU", 0)),
            free_gpus=int(free.get("GPU", 0)), free_cpus=float(free.get("CPU", 0)),
            is_head="node:__internal_head__" in res))
    now = time.monotonic()
    for rn in out:
        _FIRST_SEEN.setdefault(rn.node_id, now)
    kept, dropped = newest_per_name(out, first_seen=_FIRST_SEEN)
    if dropped and store is not None:
        kept, dropped = newest_per_name(out, first_seen=_FIRST_SEEN, stored={
            n.name: n.node_id for n in store.list_nodes()})
    for name, ids in dropped:
        if (name, *ids) in _WARNED:
            continue
        _WARNED.add((name, *ids))
        log.warning("Ray lists %d live nodes named %s: using the newest, leaving out %s (the "
                    "old incarnation of a host whose Ray restarted, not yet declared dead)",
                    len(ids) + 1, name, ", ".join(i[:12] for i in ids))
    return kept


def _discovery_task(options: dict[str, Any]) -> dict[str, Any]:
    """Runs on the pinned node; returns a plain dict (mappingproxy values do not pickle)."""
    out = discover_local_node(**options).to_dict()
    out["node_id"] = ray.get_runtime_context().get_node_id()
    return out


def discover_cluster(*, timeout_s: float = 60.0, options: Mapping[str, Any] | None = None,
                     only: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Runs discovery on every alive Ray node (or the node ids in `only`), pinned with a hard
    node-affinity strategy.

    Returns {node_id: LocalDiscovery.to_dict() + {"node_id": ...}}; a node that does not
    answer within `timeout_s` gets {"node_id": ..., "error": "..."} instead.
    """
    wanted = None if only is None else set(only)
    task = ray.remote(num_cpus=0, max_retries=0)(_discovery_task)
    refs = {}
    for node in ray.nodes():
        nid = node["NodeID"]
        if not node.get("Alive") or (wanted is not None and nid not in wanted):
            continue
        strategy = NodeAffinitySchedulingStrategy(node_id=nid, soft=False)
        refs[nid] = task.options(scheduling_strategy=strategy).remote(dict(options or {}))
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    results: dict[str, dict[str, Any]] = {}
    for nid, ref in refs.items():
        if ref not in done:
            ray.cancel(ref, force=True)
            results[nid] = {"node_id": nid, "error": f"no answer within {timeout_s:g}s"}
            continue
        try:
            results[nid] = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the task itself failed on that node
            results[nid] = {"node_id": nid, "error": f"{type(exc).__name__}: {exc}"}
    return results


class TopologySource:
    """The cluster's topology: declared (`cluster_file`) or discovered (see the module doc).

    `discovery` are `discover_local_node` options (a test points `nvidia_smi` at a stand-in).
    Thread-safe: the scheduler and the node registration both ask.
    """

    def __init__(self, *, cluster_file: Path | None,
                 discovery: Mapping[str, Any] | None = None, timeout_s: float = 60.0) -> None:
        self.cluster_file = cluster_file
        self.discovery = dict(discovery or {})
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._declared: ClusterTopology | None = None
        self._discovered: tuple[frozenset[str], ClusterTopology | None] | None = None

    def current(self, ray_nodes: list[RayNode]) -> ClusterTopology | None:
        with self._lock:
            if self.cluster_file is not None:
                if self._declared is None:
                    self._declared = load_cluster_file(self.cluster_file)
                return self._declared
            gpu_nodes = frozenset(n.node_id for n in ray_nodes if n.gpus)
            if not gpu_nodes:
                return None
            if self._discovered is None or self._discovered[0] != gpu_nodes:
                self._discovered = (gpu_nodes, self._discover(gpu_nodes))
            return self._discovered[1]

    def _discover(self, gpu_nodes: frozenset[str]) -> ClusterTopology:
        results = discover_cluster(timeout_s=self.timeout_s, options=self.discovery,
                                   only=gpu_nodes)
        for nid, res in sorted(results.items()):
            for err in ([res["error"]] if "error" in res else res.get("errors", [])):
                log.warning("topology discovery on node %s: %s", nid[:12], err)
        topology = cluster_from_discovery(results, ray.nodes())
        log.info("discovered the topology of %d GPU node(s): %s", len(gpu_nodes),
                 ", ".join(f"{n.name} {len(n.topology.gpus)} GPUs" for n in topology.nodes
                           if n.node_id in gpu_nodes))
        return topology


def register_nodes(store: Store, topology: TopologySource) -> None:
    """Writes Ray's live nodes joined with their topology into the store."""
    ray_nodes = read_ray_nodes(store)
    snap = build_snapshot(ray_nodes=ray_nodes, topology=topology.current(ray_nodes))
    for node, ray_node in zip(snap.cluster.nodes, ray_nodes, strict=True):
        store.upsert_node(name=node.name, node_id=node.node_id, alive=True,
                          labels=dict(node.labels), gpus=len(node.topology.gpus),
                          cpus=ray_node.cpus, topology=node_topology_to_dict(node.topology))
    store.mark_nodes_dead(except_names={n.name for n in snap.cluster.nodes})


def nodes_changed(store: Store) -> bool:
    """Whether Ray's live node ids differ from the ids of the nodes the store holds alive."""
    live = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return live != {n.node_id for n in store.list_nodes() if n.alive}
