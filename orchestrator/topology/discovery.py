"""Discover the local node's topology, and build the cluster's from every node's answer.

discover_local_node() combines `nvidia-smi topo -m`, NVML (when nvidia-ml-py is installed)
and sysfs InfiniBand. A tool that is missing or fails is recorded in `errors`, never raised:
a CPU-only node comes back with 0 GPUs. The runtime runs it once on every GPU node from a
pinned Ray task (orchestrator/runtime/nodes.py) and cluster_from_discovery() turns the
answers plus the nodes' Ray labels into a ClusterTopology. Pure module.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.topology.infiniband import SYSFS_IB, apply_ib_ports, read_ib_ports
from orchestrator.topology.labels import (
    NODE_NAME_LABEL,
    cluster_levels,
    levels_from_node_labels,
    nvlink_domain_of,
)
from orchestrator.topology.model import (
    NVLINK_DOMAIN_LEVEL,
    ClusterNode,
    ClusterTopology,
    Gpu,
    NodeTopology,
)
from orchestrator.topology.nvidia_smi import parse_topo_matrix
from orchestrator.topology.nvml import NvmlUnavailable, merge_nvml, read_nvml
from orchestrator.topology.serialize import node_topology_from_dict, node_topology_to_dict

AUTO = "auto"


@dataclass(frozen=True)
class LocalDiscovery:
    hostname: str
    topology: NodeTopology
    sources: tuple[str, ...] = ()  # what contributed: nvidia-smi, nvml, sysfs-ib
    errors: tuple[str, ...] = ()  # what was tried and failed, for the operator
    labels: Mapping[str, str] = field(default_factory=dict)  # levels found locally

    def to_dict(self) -> dict[str, Any]:
        return {"hostname": self.hostname, "topology": node_topology_to_dict(self.topology),
                "sources": list(self.sources), "errors": list(self.errors),
                "labels": dict(self.labels)}

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> LocalDiscovery:
        return LocalDiscovery(hostname=str(doc["hostname"]),
                              topology=node_topology_from_dict(doc["topology"]),
                              sources=tuple(doc.get("sources", ())),
                              errors=tuple(doc.get("errors", ())),
                              labels=dict(doc.get("labels", {})))


def run_topo_m(nvidia_smi: str = "nvidia-smi", *, timeout_s: float = 20.0) -> str:
    """stdout of `nvidia-smi topo -m`; RuntimeError with the tool's own words on failure."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        raise FileNotFoundError(f"{nvidia_smi} not found on PATH")
    try:
        proc = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{nvidia_smi} topo -m timed out after {timeout_s:g}s") from exc
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        raise RuntimeError(f"{nvidia_smi} topo -m exited {proc.returncode}: "
                           f"{said[0] if said else 'no output'}")
    return proc.stdout


def _try_topo_m(nvidia_smi: str | None, timeout_s: float, errors: list[str]
                ) -> NodeTopology | None:
    if nvidia_smi is None:
        return None
    try:
        return parse_topo_matrix(run_topo_m(nvidia_smi, timeout_s=timeout_s))
    except FileNotFoundError:
        return None  # a CPU node: nothing to report
    except (OSError, RuntimeError, ValueError) as exc:
        errors.append(f"nvidia-smi: {exc}")
        return None


def _try_nvml(nvml_module: Any, errors: list[str]) -> tuple[Any, ...] | None:
    if nvml_module is None:
        return None
    try:
        return read_nvml(None if nvml_module == AUTO else nvml_module)
    except NvmlUnavailable as exc:
        if not exc.missing:
            errors.append(f"nvml: {exc}")
        return None
    except Exception as exc:  # a driver/binding mismatch must not break discovery
        errors.append(f"nvml: {type(exc).__name__}: {exc}")
        return None


def discover_local_node(*, nvidia_smi: str | None = "nvidia-smi", nvml_module: Any = AUTO,
                        ib_root: str | None = SYSFS_IB, timeout_s: float = 20.0,
                        hostname: str | None = None) -> LocalDiscovery:
    """This node's topology from every source available; never raises for missing tools.

    Pass None to skip a source; `nvml_module` may be a pynvml-like object (tests).
    """
    errors: list[str] = []
    sources: list[str] = []
    topo = _try_topo_m(nvidia_smi, timeout_s, errors)
    if topo is not None:
        sources.append("nvidia-smi")
    gpus = _try_nvml(nvml_module, errors)
    if gpus:
        topo = merge_nvml(topo, gpus)
        sources.append("nvml")
    if topo is None:
        topo = NodeTopology(gpus=())
    if ib_root is not None:
        try:
            ports = read_ib_ports(ib_root)
        except OSError as exc:
            errors.append(f"sysfs-ib: {exc}")
            ports = ()
        if ports:
            topo = apply_ib_ports(topo, ports)
            sources.append("sysfs-ib")
    domain = nvlink_domain_of(topo)
    labels = {NVLINK_DOMAIN_LEVEL: domain} if domain else {}
    return LocalDiscovery(hostname=hostname or socket.gethostname(), topology=topo,
                          sources=tuple(sources), errors=tuple(errors), labels=labels)


def _node_topology(found: Mapping[str, Any] | None, ray_gpus: int) -> NodeTopology:
    topo = node_topology_from_dict(found["topology"]) if found and "topology" in found else None
    if topo is not None and topo.gpus:
        return topo
    # Ray advertises GPUs discovery could not see (simulated `num_gpus`): links unknown,
    # which NodeTopology.link reports as SYS, the pessimistic class.
    return NodeTopology(gpus=tuple(Gpu(index=i) for i in range(ray_gpus)))


def cluster_from_discovery(results: Mapping[str, Mapping[str, Any]],
                           ray_nodes: Iterable[Mapping[str, Any]]) -> ClusterTopology:
    """A ClusterTopology from discover_cluster() results and `ray.nodes()` entries.

    Levels come from the nodes' Ray labels (published with `meshyard topo labels`, or
    Kubernetes keys KubeRay copied) plus an NVML-discovered nvlink_domain. A node is named
    by its `meshyard.io/node` label, else its hostname (plus the node id when not unique).
    Every node carries its Ray node id, so the result can stand in for a declared file.
    """
    alive = [n for n in ray_nodes if n.get("Alive")]
    hosts = [str(results.get(n["NodeID"], {}).get("hostname", "node")) for n in alive]
    nodes, per_node_levels = [], []
    for node, host in zip(alive, hosts, strict=True):
        nid = node["NodeID"]
        found = results.get(nid)
        levels = levels_from_node_labels(node.get("Labels") or {})
        levels.update((found or {}).get("labels") or {})
        per_node_levels.append(levels)
        name = (node.get("Labels") or {}).get(NODE_NAME_LABEL) or (
            host if hosts.count(host) == 1 else f"{host}-{nid[:8]}")
        gpus = int((node.get("Resources") or {}).get("GPU", 0))
        nodes.append(ClusterNode(name=name, topology=_node_topology(found, gpus),
                                 labels=levels, node_id=nid))
    return ClusterTopology(levels=cluster_levels(per_node_levels), nodes=tuple(nodes))
