"""Node labels ↔ meshyard levels. Pure.

Kubernetes / cloud labels name where a node sits in the fabric; meshyard calls those
positions *levels* (finest first) and publishes them as Ray node labels (`ray start
--labels "nvlink_domain=...,leaf=..."`), which the scheduler reads back, as Kueue does.

    nvidia.com/gpu.clique                        → nvlink_domain  (GPU feature discovery)
    network.topology.nvidia.com/accelerator      → nvlink_domain  (NVIDIA topograph)
    network.topology.nvidia.com/{block,spine,datacenter} → leaf, spine, datacenter
    topology.kubernetes.io/network-level-{1,2,3} → leaf, spine, datacenter (older topograph)
    cloud.google.com/gce-topology-{host,subblock,block} → host, subblock, block (GKE)
    topology.k8s.aws/network-node-layer-{3,2,1}  → leaf, spine, core (AWS; layer 1 is the top)
    meshyard.io/<level>, or a bare level name    → <level>
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from orchestrator.text.ansi import strip_ansi
from orchestrator.topology.model import NODE_LEVEL, NVLINK_DOMAIN_LEVEL, NodeTopology

# Canonical order, finest first; levels not listed here sort after these, by name.
LEVEL_ORDER = (NVLINK_DOMAIN_LEVEL, "host", "rack", "subblock", "block", "leaf", "spine",
               "core", "datacenter")

# Earlier keys win when two map to the same level.
K8S_LABEL_LEVELS: tuple[tuple[str, str], ...] = (
    ("nvidia.com/gpu.clique", NVLINK_DOMAIN_LEVEL),
    ("network.topology.nvidia.com/accelerator", NVLINK_DOMAIN_LEVEL),
    ("cloud.google.com/gce-topology-host", "host"),
    ("cloud.google.com/gce-topology-subblock", "subblock"),
    ("cloud.google.com/gce-topology-block", "block"),
    ("network.topology.nvidia.com/block", "leaf"),
    ("topology.kubernetes.io/network-level-1", "leaf"),
    ("topology.k8s.aws/network-node-layer-3", "leaf"),
    ("network.topology.nvidia.com/spine", "spine"),
    ("topology.kubernetes.io/network-level-2", "spine"),
    ("topology.k8s.aws/network-node-layer-2", "spine"),
    ("topology.k8s.aws/network-node-layer-1", "core"),
    ("network.topology.nvidia.com/datacenter", "datacenter"),
    ("topology.kubernetes.io/network-level-3", "datacenter"),
)
MESHYARD_PREFIX = "meshyard.io/"
NODE_NAME_LABEL = "meshyard.io/node"  # joins a Ray node to its declared node (inventory)
_LABEL_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_BAD_CHARS_RE = re.compile(r"[^A-Za-z0-9_.-]+")


def levels_from_node_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """meshyard level → value from a node's Kubernetes/cloud labels (see module docstring).

    >>> levels_from_node_labels({"topology.k8s.aws/network-node-layer-3": "nn-1",
    ...                          "nvidia.com/gpu.clique": "abc.3"})
    {'nvlink_domain': 'abc.3', 'leaf': 'nn-1'}
    """
    out: dict[str, str] = {}
    for key, level in K8S_LABEL_LEVELS:
        if labels.get(key) and level not in out:
            out[level] = str(labels[key])
    for key, value in labels.items():
        name = key[len(MESHYARD_PREFIX):] if key.startswith(MESHYARD_PREFIX) else key
        if name == NODE_LEVEL:
            continue  # meshyard.io/node names the node itself; it is not a level above it
        if value and (key.startswith(MESHYARD_PREFIX) or name in LEVEL_ORDER):
            out[name] = str(value)  # explicit meshyard labels override cloud ones
    return {lv: out[lv] for lv in order_levels(out)}


def order_levels(levels: Iterable[str]) -> tuple[str, ...]:
    """Finest first: the canonical LEVEL_ORDER, then any others by name."""
    seen = set(levels)
    known = [lv for lv in LEVEL_ORDER if lv in seen]
    return tuple(known + sorted(seen - set(LEVEL_ORDER)))


def cluster_levels(per_node: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The levels any node carries, finest first (input: each node's level → value)."""
    found: set[str] = set()
    for labels in per_node:
        found.update(labels)
    return order_levels(found)


def nvlink_domain_of(topo: NodeTopology) -> str | None:
    """The NVML fabric domain all GPUs of the node share, or None (no fabric, or mixed)."""
    domains = {g.nvlink_domain for g in topo.gpus}
    if len(domains) != 1:
        return None
    return next(iter(domains))


def sanitize_label_value(value: str) -> str:
    """Make a value Kubernetes/Ray-label-safe: [A-Za-z0-9_.-], alnum ends, at most 63."""
    v = _BAD_CHARS_RE.sub("-", str(value)).strip("-_.")[:63].rstrip("-_.")
    return v


def is_valid_label(text: str) -> bool:
    return bool(_LABEL_RE.match(text))


def to_ray_labels_arg(levels: Mapping[str, str], *, node_name: str | None = None) -> str:
    """`key=value,...` for `ray start --labels`, levels finest first; values sanitized.
    `node_name` adds `meshyard.io/node=<name>`, the key that joins a Ray node to the node of
    that name in a declared cluster file.

    >>> to_ray_labels_arg({"leaf": "leaf a", "nvlink_domain": "6f1e.3"}, node_name="dgx-a1")
    'meshyard.io/node=dgx-a1,nvlink_domain=6f1e.3,leaf=leaf-a'
    """
    parts = [f"{NODE_NAME_LABEL}={sanitize_label_value(node_name)}"] if node_name else []
    for level in order_levels(levels):
        if not is_valid_label(level):
            raise ValueError(f"level name {level!r} is not a valid Ray label key; use letters, "
                             "digits, '-', '_' or '.', starting and ending alphanumeric")
        value = sanitize_label_value(levels[level])
        if value:
            parts.append(f"{level}={value}")
    return ",".join(parts)


def parse_labels_text(text: str) -> dict[str, str]:
    """Labels from `k=v,k=v`, or one per line as `k=v`, `k="v"` (Kubernetes downward API
    files) or `k: v`. Blank lines and '#' comments are ignored."""
    out: dict[str, str] = {}
    text = strip_ansi(text)
    items = text.splitlines() if "\n" in text.strip() else text.split(",")
    for raw in items:
        item = raw.strip()
        if not item or item.startswith("#"):
            continue
        key, sep, value = item.partition("=")
        if not sep:
            key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise ValueError(f"label {item!r} is not key=value (e.g. leaf=leaf-a)")
        out[key.strip()] = value.strip().strip('"')
    return out
