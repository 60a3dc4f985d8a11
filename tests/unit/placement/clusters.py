"""Small clusters for placement tests, built in code from the topology model."""

from __future__ import annotations

from pathlib import Path

from orchestrator.topology.declared import pcie_topology
from orchestrator.topology.model import ClusterNode, ClusterTopology, Gpu, NodeTopology
from orchestrator.topology.nvidia_smi import parse_topo_matrix

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topo"


def dgx1() -> NodeTopology:
    """The real DGX-1 V100 hybrid cube mesh, parsed from its `nvidia-smi topo -m`."""
    return parse_topo_matrix((FIXTURES / "topo_dgx1_v100_hybrid_cube_mesh_nv1_nv2.txt").read_text())


def p40_pcie() -> NodeTopology:
    """8x P40 behind PCIe switches: PIX inside {0-3} and {4-7}, PXB across."""
    return parse_topo_matrix((FIXTURES / "topo_p40_8gpu_pcie_pix_pxb_legacy_soc_legend.txt")
                             .read_text())


def nvswitch(n: int = 8) -> NodeTopology:
    return NodeTopology.uniform(n, "NV18")


def islands(n: int, size: int) -> NodeTopology:
    """NVLink islands of `size` GPUs (NV12 inside), SYS between islands."""
    links = {(a, b): ("NV12" if a // size == b // size else "SYS")
             for a in range(n) for b in range(a + 1, n)}
    return NodeTopology(gpus=tuple(Gpu(index=i) for i in range(n)), links=links)


def pcie(n: int = 8) -> NodeTopology:
    return pcie_topology(n)


def cluster(nodes: list[tuple[str, NodeTopology, dict[str, str], list[int]]],
            levels: tuple[str, ...] = ("leaf",)) -> ClusterTopology:
    return ClusterTopology(levels=levels, nodes=tuple(
        ClusterNode(name=name, topology=topo, labels=labels, busy_gpus=frozenset(busy))
        for name, topo, labels, busy in nodes))
