"""Link figures and the bottleneck link of a communication group on a placement.

Pure module. The figures are per direction; `meshyard calibrate` measures them on real nodes
(orchestrator/planner/calibration), so every figure lives in one overridable value,
`LinkFigures`.

A group's bottleneck is the slowest link the best ring through its members must use:
- inside one node, the best Hamiltonian ring over the pairwise link classes (NCCL builds its
  rings along the topology, not in rank order: on a DGX-1 the quad {0, 1, 4, 5} has the
  all-NVLink ring 0-1-5-4-0 even though 0-5 is SYS);
- across nodes, the network crossing at the coarsest level the group spans (a ring over
  nodes that sit under two spines crosses the spine twice), slowed by `upper_level_factor` per
  level above the leaf and by `rail_misaligned_factor` when peers are not on the same rail;
- across nodes of one multi-node NVLink domain (GB200 NVL72), NVLink.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from orchestrator.placement.nodeinfo import fingerprint, nvlink_domain_key, uniform_kind
from orchestrator.topology.model import (
    NVLINK_DOMAIN_LEVEL,
    ClusterNode,
    ClusterTopology,
    NodeTopology,
    nvlink_count,
)

Member = tuple[str, int]  # (node name, local GPU index)

_PCIE_FACTORS = (("PIX", 1.0), ("PXB", 0.9), ("PHB", 0.75), ("NODE", 0.6), ("SYS", 0.4),
                 ("SOC", 0.4))


@dataclass(frozen=True)
class LinkFigures:
    """Per-direction bandwidth (GB/s) and latency (microseconds) of each link class.

    NV# pairs: 18+ bonded links are NVLink4 (H100 SXM), 12+ NVLink3 (A100 SXM), fewer links
    `n * nvlink_per_link_gbs` (DGX-1 V100: NV1 25, NV2 50). PCIe paths take the x16 figure
    of `pcie_gen` times the class factor (PIX 1.0 … SYS 0.4: host bridges and the SMP link cost
    bandwidth). Inter-node traffic takes the InfiniBand figure of `network`.

    gloo (CPU ranks) has figures of its own, which only the pre-flight check uses: ranks on one
    host (loopback TCP) and across hosts (TCP over the host network). The defaults are below
    what a healthy gang measures on a loaded 2-core host (bench/README.md: 1 MiB all-reduce
    best 0.4-1.8 GB/s, p2p 1-2.5 GB/s), so only a link far slower than that fails the check.
    """

    nvlink4_gbs: float = 450.0
    nvlink3_gbs: float = 300.0
    nvlink_per_link_gbs: float = 25.0
    pcie5_x16_gbs: float = 64.0
    pcie4_x16_gbs: float = 32.0
    ib_ndr_gbs: float = 50.0
    ib_hdr_gbs: float = 25.0
    pcie_gen: int = 4
    network: str = "ndr"  # ndr | hdr
    pcie_factors: tuple[tuple[str, float], ...] = _PCIE_FACTORS
    upper_level_factor: float = 0.5  # bandwidth kept per switch level above the leaf
    rail_misaligned_factor: float = 0.8  # peers on different rails cross an extra switch
    nvlink_alpha_us: float = 2.0
    pcie_alpha_us: float = 3.0
    net_alpha_us: float = 5.0
    hop_alpha_us: float = 1.0  # per switch level above the leaf
    gloo_loopback_gbs: float = 0.25
    gloo_loopback_alpha_us: float = 100.0
    gloo_net_gbs: float = 0.1  # 1 GbE carries 0.125 GB/s
    gloo_net_alpha_us: float = 200.0

    def __post_init__(self) -> None:
        if self.network not in ("ndr", "hdr"):
            raise ValueError(f"network={self.network!r}: use 'ndr' or 'hdr'")
        if self.pcie_gen not in (4, 5):
            raise ValueError(f"pcie_gen={self.pcie_gen}: use 4 or 5")

    @property
    def network_gbs(self) -> float:
        return self.ib_ndr_gbs if self.network == "ndr" else self.ib_hdr_gbs

    @property
    def pcie_gbs(self) -> float:
        return self.pcie5_x16_gbs if self.pcie_gen == 5 else self.pcie4_x16_gbs

    def nvlink_gbs(self, links: int) -> float:
        if links >= 18:
            return self.nvlink4_gbs
        if links >= 12:
            return self.nvlink3_gbs
        return links * self.nvlink_per_link_gbs


@dataclass(frozen=True)
class Link:
    """A link class with its figures; `kind` is e.g. 'NV12', 'PIX', 'IB@leaf', 'NVL-domain'."""

    kind: str
    gbs: float
    alpha_s: float


def intra_node_link(kind: str, figures: LinkFigures) -> Link:
    n = nvlink_count(kind)
    if n:
        return Link(kind, figures.nvlink_gbs(n), figures.nvlink_alpha_us * 1e-6)
    factor = dict(figures.pcie_factors).get(kind, dict(figures.pcie_factors).get("SYS", 0.4))
    return Link(kind, figures.pcie_gbs * factor, figures.pcie_alpha_us * 1e-6)


def worst(links: Iterable[Link]) -> Link | None:
    """Slowest link by bandwidth; on equal bandwidth the one with more latency."""
    out: Link | None = None
    for link in links:
        if out is None or (link.gbs, -link.alpha_s) < (out.gbs, -out.alpha_s):
            out = link
    return out


def _has_ham_cycle(n: int, adj: list[int]) -> bool:
    """Hamiltonian cycle through all n vertices (bitmask DP from vertex 0; n <= 10)."""
    if n <= 2:
        return n < 2 or bool(adj[0] & 2)
    full = (1 << n) - 1
    reach = [0] * (1 << n)  # reach[mask]: end vertices of paths from 0 covering mask
    reach[1] = 1
    for mask in range(1, full + 1, 2):
        ends = reach[mask]
        if not ends:
            continue
        for v in range(n):
            if ends >> v & 1:
                nxt = adj[v] & ~mask
                while nxt:
                    w = (nxt & -nxt).bit_length() - 1
                    reach[mask | 1 << w] |= 1 << w
                    nxt &= nxt - 1
    ends = reach[full]
    return any(ends >> v & 1 and adj[v] & 1 for v in range(1, n))


def best_ring_link(topo: NodeTopology, gpus: Sequence[int], figures: LinkFigures) -> Link | None:
    """Bottleneck of the best ring through `gpus` inside one node (None for one GPU)."""
    gpus = sorted(gpus)
    n = len(gpus)
    if n < 2:
        return None
    kind = uniform_kind(topo)
    if kind is not None:
        return intra_node_link(kind, figures)
    kinds = {(a, b): topo.link(a, b) for a, b in combinations(gpus, 2)}
    by_kind = {k: intra_node_link(k, figures) for k in set(kinds.values())}
    if len(by_kind) == 1 or n > 10:
        # Uniform sets are trivially their link; past 10 GPUs take the worst pair (pessimistic).
        return worst(by_kind.values())
    pairs = {pair: by_kind[k] for pair, k in kinds.items()}
    for threshold in sorted({p.gbs for p in pairs.values()}, reverse=True):
        adj = [0] * n
        for (a, b), link in pairs.items():
            if link.gbs >= threshold:
                ia, ib = gpus.index(a), gpus.index(b)
                adj[ia] |= 1 << ib
                adj[ib] |= 1 << ia
        if _has_ham_cycle(n, adj):
            return worst(p for p in pairs.values() if p.gbs == threshold)
    return worst(pairs.values())  # unreachable: the complete graph always has a ring


class LinkModel:
    """Pairwise and group links on one cluster, with per-node ring results cached."""

    def __init__(self, cluster: ClusterTopology, figures: LinkFigures | None = None) -> None:
        self.cluster = cluster
        self.figures = figures or LinkFigures()
        self._nodes = {n.name: n for n in cluster.nodes}
        self._net_levels = tuple(lv for lv in cluster.levels if lv != NVLINK_DOMAIN_LEVEL)
        self._nvl = {n.name: nvlink_domain_key(cluster, n) for n in cluster.nodes}
        self._any_nvl = any(self._nvl.values())
        self._ring_cache: dict[tuple[str, tuple[int, ...]], Link | None] = {}
        self._twin_cache: dict[tuple[object, tuple[int, ...]], Link | None] = {}
        self.memo: dict[tuple[object, ...], list[int]] = {}  # per-solve answers (gpus.py)
        self._span_cache: dict[tuple[str, ...], int] = {}
        self._net_cache: dict[tuple[int, bool], Link] = {}

    def node(self, name: str) -> ClusterNode:
        return self._nodes[name]

    def nvlink_domain(self, name: str) -> str | None:
        """Label of the node's multi-node NVLink domain, when the cluster has that level."""
        key = self._nvl.get(name)
        return "/".join(key) if key else None

    def span(self, names: Iterable[str]) -> int:
        """Switch levels climbed to connect `names`: 0 one node, 1 one leaf, 2 one spine, ..."""
        key = tuple(sorted(set(names)))
        if len(key) <= 1:
            return 0
        hit = self._span_cache.get(key)
        if hit is None:
            hit = len(self._net_levels) + 1
            for i, level in enumerate(self._net_levels):
                if len({self._nodes[n].labels.get(level, "") for n in key}) == 1:
                    hit = i + 1
                    break
            self._span_cache[key] = hit
        return hit

    def level_name(self, span: int) -> str:
        if span == 0:
            return "node"
        if span <= len(self._net_levels):
            return self._net_levels[span - 1]
        return "cluster"

    def ring(self, name: str, gpus: Sequence[int]) -> Link | None:
        key = (name, tuple(sorted(gpus)))
        hit = self._ring_cache.get(key)
        if hit is None and key not in self._ring_cache:
            # nodes of one model share their answers (a 512-node DGX-1 cluster: one search)
            topo = self._nodes[name].topology
            twin = (fingerprint(topo), key[1])
            if twin not in self._twin_cache:
                self._twin_cache[twin] = best_ring_link(topo, key[1], self.figures)
            hit = self._ring_cache[key] = self._twin_cache[twin]
        return hit

    def network_link(self, span: int, *, rail_aligned: bool) -> Link:
        hit = self._net_cache.get((span, rail_aligned))
        if hit is None:
            hit = self._net_cache[(span, rail_aligned)] = self._network_link(span, rail_aligned)
        return hit

    def _network_link(self, span: int, rail_aligned: bool) -> Link:
        f = self.figures
        gbs = f.network_gbs * f.upper_level_factor ** max(0, span - 1)
        kind = f"IB@{self.level_name(span)}"
        if not rail_aligned:
            gbs *= f.rail_misaligned_factor
            kind += "/cross-rail"
        alpha = (f.net_alpha_us + f.hop_alpha_us * max(0, span - 1)) * 1e-6
        return Link(kind, gbs, alpha)

    def group_link(self, members: Sequence[Member]) -> Link | None:
        """Bottleneck link of a collective over `members` (None when there is one member)."""
        if len(members) < 2:
            return None
        first = members[0][0]
        if all(m[0] == first for m in members):  # the common case: one node
            return self.ring(first, [g for _, g in members])
        by_node: dict[str, list[int]] = {}
        for name, gpu in members:
            if name in by_node:
                by_node[name].append(gpu)
            else:
                by_node[name] = [gpu]
        if len(by_node) == len(members) and not self._any_nvl:
            # one GPU per node (data-parallel and pipeline peers): only the network counts
            gpus = {g for _, g in members}
            return self.network_link(self.span(by_node), rail_aligned=len(gpus) == 1)
        links = [self.ring(name, gpus) for name, gpus in by_node.items() if len(gpus) > 1]
        if len(by_node) > 1:
            domains = {self._nvl[n] for n in by_node} if self._any_nvl else {None}
            if len(domains) == 1 and None not in domains:
                f = self.figures
                links.append(Link("NVL-domain", f.nvlink4_gbs, f.nvlink_alpha_us * 1e-6))
            else:
                rails = {tuple(sorted(g)) for g in by_node.values()}
                links.append(self.network_link(self.span(by_node), rail_aligned=len(rails) == 1))
        return worst(link for link in links if link is not None)

    def pair_link(self, a: Member, b: Member) -> Link | None:
        return self.group_link((a, b))
