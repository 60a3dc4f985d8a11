"""JSON-able dicts for topology values (API responses, the nodes table, Ray task results).

Pure. `node_topology_from_dict(node_topology_to_dict(t)) == t` for any NodeTopology.
Shape (also what `meshyard topo parse --json` prints)::

    {"gpus": [{"index": 0, "numa_node": 0, ...}],
     "nics": [{"name": "mlx5_0", "index": 0, "nearest_gpus": [0, 1],
               "gpu_links": [{"gpu": 0, "type": "PXB"}, ...]}],
     "links": [{"a": 0, "b": 1, "type": "NV12"}, ...]}
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from orchestrator.topology.model import Gpu, Nic, NodeTopology

_GPU_FIELDS = {f.name for f in fields(Gpu)}
_NIC_FIELDS = {f.name for f in fields(Nic)}


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def node_topology_to_dict(topo: NodeTopology) -> dict[str, Any]:
    gpus = [_drop_none(asdict(g)) for g in topo.gpus]
    nics = []
    for nic in topo.nics:
        d = _drop_none(asdict(nic))
        d["nearest_gpus"] = list(nic.nearest_gpus)
        d["gpu_links"] = [{"gpu": g, "type": t}
                          for (g, n), t in sorted(topo.gpu_nic_links.items()) if n == nic.name]
        nics.append({"name": d.pop("name"), **d})
    links = [{"a": a, "b": b, "type": t} for (a, b), t in sorted(topo.links.items())]
    return {"gpus": gpus, "nics": nics, "links": links}


def node_topology_from_dict(doc: dict[str, Any]) -> NodeTopology:
    """Inverse of node_topology_to_dict; ValueError names the bad entry."""
    try:
        gpus = tuple(Gpu(**{k: v for k, v in g.items() if k in _GPU_FIELDS})
                     for g in doc.get("gpus", []))
        links = {(int(x["a"]), int(x["b"])): str(x["type"]) for x in doc.get("links", [])}
        nics = []
        gpu_nic: dict[tuple[int, str], str] = {}
        for n in doc.get("nics", []):
            kw = {k: v for k, v in n.items() if k in _NIC_FIELDS}
            kw["nearest_gpus"] = tuple(kw.get("nearest_gpus", ()))
            nics.append(Nic(**kw))
            for gl in n.get("gpu_links", []):
                gpu_nic[(int(gl["gpu"]), str(n["name"]))] = str(gl["type"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"bad node topology document ({exc!r}); expected the shape of "
                         "`meshyard topo parse --json`: gpus, nics, links") from exc
    return NodeTopology(gpus=gpus, links=links, nics=tuple(nics), gpu_nic_links=gpu_nic)
