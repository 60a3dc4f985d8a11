"""Declared cluster files (YAML): simulated clusters and operators who know their fabric.

Format (see examples/clusters/README.md)::

    levels: [leaf, spine]          # label names above the node, finest first
    defaults: {gpus: 8, intra_node: nvswitch}   # optional, merged into every node
    nodes:
      - name: dgx-a1
        labels: {leaf: leaf-a, spine: spine-0}
        busy_gpus: [0, 1]          # optional
      - name: p40-box
        labels: {leaf: leaf-b, spine: spine-0}
        topo_m: |                  # or topo_m_file: path relative to this file
          <output of nvidia-smi topo -m>

Only a file on disk may name another file (`topo_m_file`); a document that arrives in a request
(`parse_cluster_doc` without `base_dir`) carries its topology inline, so a request can never
make the server open a path. Bounded: at most MAX_GPUS_PER_NODE GPUs per node and
MAX_TOPO_M_CHARS per topo_m; nodes with the same generated shape share one NodeTopology, and
one document may generate at most MAX_GENERATED_PAIRS GPU pairs.

`intra_node` (used when there is no `topo_m`): `nvswitch` (every GPU pair NV18), `pcie`
(two sockets, first half of the GPUs on socket 0: pairs 2k/2k+1 on one socket are PIX,
other same-socket pairs NODE, cross-socket SYS), or any link class such as `NV12` or `PHB`
for a uniform node. Pure module: PyYAML is imported only by load_cluster_file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.bounds.limits import MAX_GPUS_PER_NODE, MAX_TOPO_M_CHARS
from orchestrator.text.ansi import strip_ansi
from orchestrator.topology.model import (
    NODE_LEVEL,
    ClusterNode,
    ClusterTopology,
    Gpu,
    NodeTopology,
    is_nvlink,
    link_cost,
)
from orchestrator.topology.nvidia_smi import parse_topo_matrix
from orchestrator.topology.serialize import node_topology_from_dict, node_topology_to_dict

NVSWITCH_LINK = "NV18"  # H100/B200 SXM behind NVSwitch, as `topo -m` prints it
MAX_GENERATED_PAIRS = 1 << 16  # link-table entries one document may make (intra_node shapes)
_NODE_KEYS = frozenset({"name", "gpus", "labels", "topo_m", "topo_m_file", "intra_node",
                        "busy_gpus", "node_id", "topology",
                        "free_gpus"})  # free_gpus: derived, written by cluster_to_dict, ignored
_TOP_KEYS = frozenset({"levels", "nodes", "defaults", "name", "description"})


def pcie_topology(n_gpus: int) -> NodeTopology:
    """A two-socket PCIe box (see module docstring): pairs PIX, same socket NODE, else SYS."""
    half = (n_gpus + 1) // 2
    sock = [0 if g < half else 1 for g in range(n_gpus)]
    gpus = tuple(Gpu(index=g, numa_node=sock[g]) for g in range(n_gpus))
    links: dict[tuple[int, int], str] = {}
    for a in range(n_gpus):
        for b in range(a + 1, n_gpus):
            if sock[a] != sock[b]:
                links[(a, b)] = "SYS"
            else:
                links[(a, b)] = "PIX" if a // 2 == b // 2 else "NODE"
    return NodeTopology(gpus=gpus, links=links)


class _Shapes:
    """Generated node topologies of one document: one per (GPUs, intra_node), within budget."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, str], NodeTopology] = {}
        self._pairs = 0

    def get(self, where: str, n_gpus: int, intra: str) -> NodeTopology:
        key = (n_gpus, intra)
        if key not in self._made:
            self._pairs += n_gpus * (n_gpus - 1) // 2
            if self._pairs > MAX_GENERATED_PAIRS:
                raise ValueError(f"{where}: the document's node shapes add up to more than "
                                 f"{MAX_GENERATED_PAIRS} GPU pairs; describe fewer distinct "
                                 "(gpus, intra_node) shapes")
            self._made[key] = _intra_topology(where, n_gpus, intra)
        return self._made[key]


def _intra_topology(where: str, n_gpus: int, intra: str) -> NodeTopology:
    if intra == "nvswitch":
        return NodeTopology.uniform(n_gpus, NVSWITCH_LINK)
    if intra == "pcie":
        return pcie_topology(n_gpus)
    if is_nvlink(intra) or link_cost(intra) < 9:
        return NodeTopology.uniform(n_gpus, intra)
    raise ValueError(f"{where}: intra_node {intra!r} is not known; use nvswitch, pcie, or a "
                     "link class such as NV12, PIX, PXB, PHB, NODE, SYS")


def _where(i: int, raw: Mapping[str, Any]) -> str:
    name = raw.get("name")
    return f"node {name!r} (nodes[{i}])" if name else f"nodes[{i}]"


def _int_field(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


def _gpu_count(where: str, value: Any) -> int:
    n = _int_field(where, "gpus", value)
    if n > MAX_GPUS_PER_NODE:
        raise ValueError(f"{where}: gpus: {n} is more than a node holds (at most "
                         f"{MAX_GPUS_PER_NODE}); describe a larger NVLink domain as several "
                         "nodes with an nvlink_domain label")
    return n


def _topo_m_text(where: str, raw: Mapping[str, Any], base_dir: Path | None) -> Any:
    if raw.get("topo_m_file") is None:
        text = raw.get("topo_m")
    elif base_dir is None:
        raise ValueError(f"{where}: topo_m_file names a file, and a cluster document sent "
                         "with a request is never read from disk; put the `nvidia-smi topo "
                         "-m` text itself in topo_m")
    else:
        path = Path(str(raw["topo_m_file"]))
        if not path.is_absolute():
            path = base_dir / path
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"{where}: cannot read topo_m_file {str(path)!r}: {exc}") from exc
    if text is not None and len(str(text)) > MAX_TOPO_M_CHARS:
        raise ValueError(f"{where}: topo_m has {len(str(text))} characters; a node's "
                         f"`nvidia-smi topo -m` output is far below {MAX_TOPO_M_CHARS}")
    return text


def _labels(where: str, raw: Any, levels: tuple[str, ...]) -> dict[str, str]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: labels must be a mapping such as {{leaf: leaf-a}}, "
                         f"got {raw!r}")
    labels = {str(k): str(v) for k, v in raw.items()}
    missing = [lv for lv in levels if not labels.get(lv)]
    if missing:
        example = ", ".join(f"{lv}: ..." for lv in missing)
        raise ValueError(f"{where}: labels lack level(s) {missing}; every node needs one label "
                         f"per level, add labels: {{{example}}}")
    return labels


def _node_topology(where: str, raw: Mapping[str, Any], base_dir: Path | None,
                   shapes: _Shapes) -> NodeTopology:
    text = _topo_m_text(where, raw, base_dir)
    gpus = raw.get("gpus")
    if raw.get("topology") is not None:
        topo = node_topology_from_dict(raw["topology"])
    elif text is not None:
        try:
            topo = parse_topo_matrix(str(text))
        except ValueError as exc:
            raise ValueError(f"{where}: topo_m: {exc}") from exc
    else:
        if gpus is None:
            raise ValueError(f"{where}: gpus is required when topo_m is absent (e.g. gpus: 8)")
        return shapes.get(where, _gpu_count(where, gpus), str(raw.get("intra_node", "nvswitch")))
    _gpu_count(where, len(topo.gpus))
    if gpus is not None and _int_field(where, "gpus", gpus) != len(topo.gpus):
        raise ValueError(f"{where}: gpus: {gpus} but its topology has {len(topo.gpus)} GPUs; "
                         "drop gpus or make it match")
    return topo


def _busy(where: str, raw: Any, topo: NodeTopology) -> frozenset[int]:
    if raw is None:
        return frozenset()
    if not isinstance(raw, list | tuple | set | frozenset):
        raise ValueError(f"{where}: busy_gpus must be a list of GPU indices, got {raw!r}")
    valid = set(topo.gpu_indices)
    for g in raw:
        if isinstance(g, bool) or not isinstance(g, int) or g not in valid:
            hi = max(valid) if valid else -1
            raise ValueError(f"{where}: busy_gpus has {g!r} but the node's GPUs are "
                             f"0..{hi}; list indices of existing GPUs")
    return frozenset(raw)


def _parse_node(i: int, raw: Any, *, levels: tuple[str, ...], defaults: Mapping[str, Any],
                base_dir: Path | None, shapes: _Shapes) -> ClusterNode:
    if not isinstance(raw, Mapping):
        raise ValueError(f"nodes[{i}] must be a mapping with name, gpus, labels; got {raw!r}")
    merged = {**defaults, **raw}
    if "labels" in defaults and "labels" in raw:
        merged["labels"] = {**defaults["labels"], **(raw["labels"] or {})}
    where = _where(i, merged)
    unknown = sorted(set(merged) - _NODE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_NODE_KEYS)}")
    name = merged.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: name is required (a unique string such as 'node-a')")
    topo = _node_topology(where, merged, base_dir, shapes)
    node_id = merged.get("node_id")
    return ClusterNode(name=name, topology=topo,
                       labels=_labels(where, merged.get("labels"), levels),
                       node_id=str(node_id) if node_id is not None else None,
                       busy_gpus=_busy(where, merged.get("busy_gpus"), topo))


def _levels(raw: Any) -> tuple[str, ...]:
    if raw is None:
        raise ValueError("cluster file: 'levels' is required: the label names above the node, "
                         "finest first, e.g. levels: [leaf, spine] (or [] for a flat cluster)")
    if not isinstance(raw, list | tuple) or not all(isinstance(x, str) and x for x in raw):
        raise ValueError(f"cluster file: levels must be a list of names, got {raw!r}")
    if NODE_LEVEL in raw:
        raise ValueError("cluster file: 'node' is implicit; list only the levels above it, "
                         "e.g. levels: [leaf, spine]")
    if len(set(raw)) != len(raw):
        raise ValueError(f"cluster file: levels {list(raw)} repeat a name; each level once")
    return tuple(raw)


def parse_cluster_doc(doc: Mapping[str, Any], *, base_dir: Path | None = None) -> ClusterTopology:
    """Build a ClusterTopology from a declared-cluster mapping (the parsed YAML).

    Also accepts the output of cluster_to_dict (nodes carry a `topology` entry), so the
    store can round-trip: `parse_cluster_doc(cluster_to_dict(c)) == c`. `base_dir` is the
    directory of the file the document came from; without it no `topo_m_file` is read.
    """
    if not isinstance(doc, Mapping):
        raise ValueError("cluster file: expected a mapping with 'levels' and 'nodes'")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"cluster file: unknown top-level field(s) {unknown}; "
                         f"allowed: {sorted(_TOP_KEYS)}")
    levels = _levels(doc.get("levels"))
    nodes_raw = doc.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ValueError("cluster file: 'nodes' must be a non-empty list of "
                         "{name, gpus, labels} entries")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise ValueError(f"cluster file: defaults must be a mapping, got {defaults!r}")
    shapes = _Shapes()
    nodes = tuple(_parse_node(i, raw, levels=levels, defaults=defaults, base_dir=base_dir,
                              shapes=shapes) for i, raw in enumerate(nodes_raw))
    return ClusterTopology(levels=levels, nodes=nodes)


def load_cluster_file(path: str | Path) -> ClusterTopology:
    """Read a declared cluster YAML (or JSON) file. ValueError says what to fix and where."""
    import yaml  # lazily: keeps this module importable with the stdlib alone

    p = Path(path)
    try:
        doc = yaml.safe_load(strip_ansi(p.read_text()))
    except OSError as exc:
        raise ValueError(f"cannot read cluster file {str(p)!r}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"cluster file {str(p)!r} is not valid YAML: {exc}") from exc
    try:
        return parse_cluster_doc(doc, base_dir=p.parent)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from exc


def cluster_to_dict(cluster: ClusterTopology) -> dict[str, Any]:
    """JSON-able form (GET /v1/cluster/topology, the store); parse_cluster_doc reads it back."""
    nodes = []
    for n in cluster.nodes:
        d: dict[str, Any] = {"name": n.name, "gpus": len(n.topology.gpus),
                             "labels": dict(n.labels), "busy_gpus": sorted(n.busy_gpus),
                             "free_gpus": list(n.free_gpus),
                             "topology": node_topology_to_dict(n.topology)}
        if n.node_id is not None:
            d["node_id"] = n.node_id
        nodes.append(d)
    return {"levels": list(cluster.levels), "nodes": nodes}
