"""Which ranks the calibration job puts where: one probe per topology level. Pure module.

A probe is one collective benchmark group. Levels follow the cost model's span
(`LinkModel.span`): span 0 is inside one node, span 1 two nodes under one leaf switch, span 2
two nodes that only meet at the spine, and so on up to "cluster" (no common level).

- Inside a node: the GPU node with the most free GPUs (all of them, up to `max_ranks`), so the
  group's ring runs over the node's own links; its link class is read afterwards from the
  GPUs Ray actually assigned (NVLink ring -> ``nvlink``, else ``pcie``). A cluster without GPU
  nodes probes CPU ranks on one node (loopback; recorded as ``pcie``, the host path).
- Across nodes: for every span present, one pair of nodes at exactly that span, one rank on
  each (one GPU and its NIC: the per-rail figure the cost model's network link stands for),
  link class ``network``. Two nodes of one multi-node NVLink domain (GB200 NVL72) are probed
  once as level ``nvlink_domain``, class ``nvlink``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from orchestrator.placement.links import LinkFigures, LinkModel, best_ring_link
from orchestrator.topology.model import ClusterTopology, is_nvlink


class ProbeError(ValueError):
    """The cluster offers nothing to measure (no node with two free slots)."""


@dataclass(frozen=True)
class Probe:
    """One benchmark group: `nodes[i]` hosts rank i; `gpu` says whether ranks hold a GPU."""

    level: str
    span: int
    nodes: tuple[str, ...]
    gpu: bool
    link_class: str | None = None  # known up front for network probes; intra: after placing

    @property
    def ranks(self) -> int:
        return len(self.nodes)


def plan_probes(cluster: ClusterTopology, *, free_cpus: Mapping[str, float],
                cpus_per_rank: float = 0.5, max_ranks: int = 8,
                cpu_ranks: int = 2) -> list[Probe]:
    """The probes for `cluster`, finest level first. Raises ProbeError when none fits."""
    gpu_nodes = [n for n in cluster.nodes
                 if len(n.free_gpus) >= 1 and free_cpus.get(n.name, 0.0) >= cpus_per_rank]
    use_gpu = bool(gpu_nodes)
    if use_gpu:
        hosts = gpu_nodes
        capacity = {n.name: min(len(n.free_gpus), int(free_cpus[n.name] // cpus_per_rank))
                    for n in hosts}
    else:
        hosts = [n for n in cluster.nodes if free_cpus.get(n.name, 0.0) >= cpus_per_rank]
        capacity = {n.name: int(free_cpus[n.name] // cpus_per_rank) for n in hosts}
    probes: list[Probe] = []
    best = max(hosts, key=lambda n: (capacity[n.name], n.name), default=None)
    if best is not None and capacity[best.name] >= 2:
        k = min(capacity[best.name], max_ranks if use_gpu else cpu_ranks)
        probes.append(Probe("node", 0, (best.name,) * k, use_gpu))
    model = LinkModel(cluster)
    by_span: dict[int, tuple[str, str]] = {}
    nvl_pair: tuple[str, str] | None = None
    for a, b in combinations(sorted(n.name for n in hosts), 2):
        dom = model.nvlink_domain(a)
        if dom is not None and dom == model.nvlink_domain(b):
            nvl_pair = nvl_pair or (a, b)  # GB200 NVL72: NVLink between the nodes
            continue
        by_span.setdefault(model.span((a, b)), (a, b))
    if nvl_pair is not None:
        probes.append(Probe("nvlink_domain", 1, nvl_pair, use_gpu, "nvlink"))
    for span in sorted(by_span):
        probes.append(Probe(model.level_name(span), span, by_span[span], use_gpu, "network"))
    if not probes:
        raise ProbeError(
            "no node has two free GPUs (or CPU slots) and there are no two nodes to pair: "
            "free some capacity or add a node, then run `meshyard calibrate` again")
    return probes


def intra_link(cluster: ClusterTopology, node: str,
               gpu_ids: Sequence[int]) -> tuple[str, str | None]:
    """(link class, ring bottleneck kind) of ranks on `node` holding `gpu_ids`.

    CPU ranks (no GPU ids) use the host path: ``pcie`` with no kind.
    """
    if not gpu_ids:
        return "pcie", None
    topo = cluster.node(node).topology
    known = [g for g in gpu_ids if g in topo.gpu_indices]
    link = best_ring_link(topo, known, LinkFigures()) if len(known) == len(gpu_ids) else None
    if link is None:
        return "pcie", None
    return ("nvlink" if is_nvlink(link.kind) else "pcie"), link.kind
