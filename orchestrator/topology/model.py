"""Topology model: GPUs, links and NICs inside a node; ordered label levels across nodes.

Pure module (stdlib only). Parsers (`nvidia-smi topo -m`, NVML, sysfs InfiniBand, node labels,
declared cluster files) produce these value objects; the placement solver and the cost model
consume them.

Link classes, best first, as `nvidia-smi topo -m` prints them:
  NV#  — # bonded NVLinks (NV18 on H100 SXM, NV12 on A100 SXM, NV1/NV2 on DGX-1 V100)
  PIX  — at most one PCIe bridge          PXB — several PCIe bridges, no host bridge
  PHB  — through a PCIe host bridge (CPU)  NODE — across host bridges inside one NUMA node
  SYS  — across the SMP interconnect (QPI/UPI) between NUMA nodes; SOC is its legacy name
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

NODE_LEVEL = "node"
NVLINK_DOMAIN_LEVEL = "nvlink_domain"

_NV_RE = re.compile(r"^NV(\d+)$")
# Lower is better. NV# ranks below all of these by link count (see link_cost).
_PCIE_ORDER = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}


def nvlink_count(link: str) -> int:
    """Number of bonded NVLinks for an `NV#` class, 0 otherwise. `nvlink_count('NV12') == 12`."""
    m = _NV_RE.match(link)
    return int(m.group(1)) if m else 0


def is_nvlink(link: str) -> bool:
    return nvlink_count(link) > 0


def link_cost(link: str) -> float:
    """Orders link classes best-first: any NV# < PIX < PXB < PHB < NODE < SYS == SOC.

    More NVLinks is better: cost(NV18) < cost(NV12) < cost(NV1) < cost(PIX).
    Unknown classes sort last.
    """
    n = nvlink_count(link)
    if n:
        return 1.0 - n / (n + 1.0)  # in (0, 0.5]
    return float(_PCIE_ORDER.get(link, 9))


def parse_id_list(text: str | None) -> tuple[int, ...]:
    """Expand a CPU / NUMA list as `nvidia-smi` and sysfs print it.

    `parse_id_list('0,3-5,11') == (0, 3, 4, 5, 11)`; None, '', 'N/A' give ().
    """
    if not text or text.strip().upper() == "N/A":
        return ()
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad id list {text!r}: expected e.g. '0-11,24-35'")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return tuple(out)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None = None
    numa_node: int | None = None  # the (first) CPU NUMA node the GPU is attached to
    cpu_affinity: str | None = None  # as printed, e.g. "0-47,96-143"
    pci_bus_id: str | None = None
    memory_gb: float | None = None
    numa_affinity: str | None = None  # as printed; a list on GB200, e.g. "0,3-9,11-17"
    gpu_numa_id: int | None = None  # NUMA node of the GPU's own memory (GB200 C2C)
    uuid: str | None = None
    fabric_cluster_uuid: str | None = None  # NVML fabric info (multi-node NVLink domain)
    fabric_clique_id: int | None = None

    @property
    def cpus(self) -> tuple[int, ...]:
        return parse_id_list(self.cpu_affinity)

    @property
    def nvlink_domain(self) -> str | None:
        """`<cluster uuid>.<clique id>`: GPUs sharing it share one NVLink fabric partition."""
        if self.fabric_cluster_uuid is None or self.fabric_clique_id is None:
            return None
        return f"{self.fabric_cluster_uuid}.{self.fabric_clique_id}"


@dataclass(frozen=True)
class Nic:
    """A network interface. `name` is the real device name (mlx5_0, mlx5_bond_0, eth0)."""

    name: str
    index: int | None = None  # the k of NICk in `topo -m`
    link_layer: str | None = None  # InfiniBand | Ethernet
    rate_gbps: float | None = None
    state: str | None = None
    nearest_gpus: tuple[int, ...] = ()
    pci_bus_id: str | None = None


@dataclass(frozen=True)
class NodeTopology:
    """One node's devices. `links` maps an unordered GPU pair (a < b) to its link class."""

    gpus: tuple[Gpu, ...]
    links: Mapping[tuple[int, int], str] = field(default_factory=dict)
    nics: tuple[Nic, ...] = ()
    gpu_nic_links: Mapping[tuple[int, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        norm = {(min(a, b), max(a, b)): t for (a, b), t in self.links.items() if a != b}
        object.__setattr__(self, "links", MappingProxyType(norm))
        object.__setattr__(self, "gpu_nic_links", MappingProxyType(dict(self.gpu_nic_links)))

    def __reduce__(self) -> tuple[object, ...]:
        # mappingproxy does not pickle; Ray ships these between processes.
        return (NodeTopology, (self.gpus, dict(self.links), self.nics, dict(self.gpu_nic_links)))

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def link(self, a: int, b: int) -> str:
        """Link class between two GPUs; 'X' for a GPU with itself, 'SYS' when unknown."""
        if a == b:
            return "X"
        return self.links.get((min(a, b), max(a, b)), "SYS")

    def nvlink_components(self) -> list[frozenset[int]]:
        """GPUs connected by NVLink paths (connected components); a GPU alone is its own."""
        parent = {g: g for g in self.gpu_indices}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for (a, b), t in self.links.items():
            if is_nvlink(t) and a in parent and b in parent:
                parent[find(a)] = find(b)
        groups: dict[int, set[int]] = {}
        for g in self.gpu_indices:
            groups.setdefault(find(g), set()).add(g)
        return sorted((frozenset(s) for s in groups.values()), key=lambda s: min(s))

    def nearest_nic(self, gpu: int) -> str | None:
        """Name of the NIC with the best link to `gpu`, or None without NIC data."""
        best: tuple[float, str] | None = None
        for (g, nic), t in self.gpu_nic_links.items():
            if g == gpu and (best is None or (link_cost(t), nic) < best):
                best = (link_cost(t), nic)
        if best is None:
            for n in self.nics:
                if gpu in n.nearest_gpus:
                    return n.name
            return None
        return best[1]

    @staticmethod
    def uniform(n_gpus: int, link: str) -> NodeTopology:
        """A node whose every GPU pair has the same link (NVSwitch: 'NV18'; PCIe: 'PHB')."""
        gpus = tuple(Gpu(index=i) for i in range(n_gpus))
        links = {(a, b): link for a in range(n_gpus) for b in range(a + 1, n_gpus)}
        return NodeTopology(gpus=gpus, links=links)


@dataclass(frozen=True)
class ClusterNode:
    """A node in the cluster: a stable name, an optional Ray node id, labels, busy GPUs."""

    name: str
    topology: NodeTopology
    labels: Mapping[str, str] = field(default_factory=dict)
    node_id: str | None = None
    busy_gpus: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "busy_gpus", frozenset(self.busy_gpus))

    def __reduce__(self) -> tuple[object, ...]:
        return (ClusterNode, (self.name, self.topology, dict(self.labels), self.node_id,
                              self.busy_gpus))

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(g for g in self.topology.gpu_indices if g not in self.busy_gpus)

    @property
    def key(self) -> str:
        """Identity used by placements: the Ray node id when known, else the name."""
        return self.node_id or self.name


@dataclass(frozen=True)
class ClusterTopology:
    """Nodes plus the ordered label levels above the node, finest first (e.g. leaf, spine).

    `nvlink_domain` may appear as a level for multi-node NVLink domains (GB200 NVL72).
    """

    levels: tuple[str, ...]
    nodes: tuple[ClusterNode, ...]

    def __post_init__(self) -> None:
        dupes = {name for name, k in Counter(n.name for n in self.nodes).items() if k > 1}
        if dupes:
            raise ValueError(f"duplicate node names {sorted(dupes)}; node names must be unique")

    def node(self, name_or_id: str) -> ClusterNode:
        for n in self.nodes:
            if name_or_id in (n.name, n.node_id):
                return n
        raise KeyError(name_or_id)

    def path(self, node: ClusterNode) -> tuple[str, ...]:
        """Label values of `node` from the coarsest level to the finest (sort key along the
        switch tree). A missing label is ''."""
        return tuple(node.labels.get(level, "") for level in reversed(self.levels))

    def with_busy(self, busy: Mapping[str, Iterable[int]]) -> ClusterTopology:
        """A copy with extra busy GPUs per node name."""
        nodes = tuple(
            ClusterNode(name=n.name, topology=n.topology, labels=n.labels, node_id=n.node_id,
                        busy_gpus=n.busy_gpus | frozenset(busy.get(n.name, ())))
            for n in self.nodes
        )
        return ClusterTopology(levels=self.levels, nodes=nodes)

    @property
    def max_gpus_per_node(self) -> int:
        return max((len(n.topology.gpus) for n in self.nodes), default=0)
