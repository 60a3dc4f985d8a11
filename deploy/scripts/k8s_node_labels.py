#!/usr/bin/env python3
"""Write this pod's Kubernetes *node* topology labels to a file (init container of a Ray worker).

The downward API exposes a pod's own labels, not its node's, so the worker's init container
reads the node object from the Kubernetes API (`get nodes`, nothing else; see
deploy/kubernetes/base/rbac.yaml) and keeps the labels meshyard maps to topology levels:

    nvidia.com/gpu.clique=6f1e.3            (GPU feature discovery)
    cloud.google.com/gce-topology-block=b1  (GKE)
    topology.k8s.aws/network-node-layer-3=nn-1
    network.topology.nvidia.com/spine=s0    (topograph)
    meshyard.io/<level>=...                 (set by the operator)

The Ray container then runs

    ray start ... --labels="$(meshyard topo labels --labels-file FILE --node-name NODE)"

Stdlib only (urllib + ssl), so it runs before anything else in the image is trusted.
Environment: KUBERNETES_SERVICE_HOST/PORT (set by Kubernetes); MESHYARD_K8S_API_URL
overrides the API address (tests use a local HTTP server).

    meshyard-k8s-node-labels --node "$MESHYARD_NODE_NAME" --out /etc/meshyard/node-labels
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Keys (or prefixes, ending in '/' or '-') meshyard maps to levels; orchestrator/topology/
# labels.py holds the mapping itself. Unknown keys are dropped: the file stays small and
# carries nothing but topology.
TOPOLOGY_KEYS = (
    "nvidia.com/gpu.clique",
    "cloud.google.com/gce-topology-",
    "topology.k8s.aws/network-node-layer-",
    "network.topology.nvidia.com/",
    "topology.kubernetes.io/network-level-",
    "meshyard.io/",
)


def is_topology_key(key: str) -> bool:
    return any(key == k or (k[-1] in "/-" and key.startswith(k)) for k in TOPOLOGY_KEYS)


def topology_labels(node_labels: Mapping[str, str]) -> dict[str, str]:
    """The node's labels that carry topology, sorted by key."""
    return {k: str(v) for k, v in sorted(node_labels.items()) if is_topology_key(k) and v}


def render_labels_file(labels: Mapping[str, str]) -> str:
    """`key="value"` lines, the format of downward-API label files (read by
    `meshyard topo labels --labels-file`)."""
    return "".join(f'{k}="{v}"\n' for k, v in labels.items())


def api_base_url() -> str:
    override = os.environ.get("MESHYARD_K8S_API_URL")
    if override:
        return override.rstrip("/")
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("KUBERNETES_SERVICE_HOST is not set: not running in a pod? "
                           "Set MESHYARD_K8S_API_URL to the API server address")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def fetch_node_labels(node: str, *, base_url: str, token: str | None,
                      ca_file: Path | None, timeout_s: float = 10.0) -> dict[str, str]:
    url = f"{base_url}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = None
    if url.startswith("https://"):
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:
        body = json.load(resp)
    labels = body.get("metadata", {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node", default=os.environ.get("MESHYARD_NODE_NAME"),
                    help="Kubernetes node name [env MESHYARD_NODE_NAME, from spec.nodeName]")
    ap.add_argument("--out", type=Path, required=True, help="labels file to write")
    ap.add_argument("--sa-dir", type=Path, default=SA_DIR,
                    help="service account token + ca.crt directory")
    args = ap.parse_args(argv)
    if not args.node:
        ap.error("--node (or MESHYARD_NODE_NAME) is required")
    try:
        labels = fetch_node_labels(args.node, base_url=api_base_url(),
                                   token=_read(args.sa_dir / "token"),
                                   ca_file=(args.sa_dir / "ca.crt")
                                   if (args.sa_dir / "ca.crt").exists() else None)
    except (urllib.error.URLError, OSError, RuntimeError, ValueError) as exc:
        print(f"meshyard-k8s-node-labels: cannot read node {args.node!r}: {exc}. Check the "
              "pod's service account may `get nodes` (deploy/kubernetes/base/rbac.yaml)",
              file=sys.stderr)
        return 1
    kept = topology_labels(labels)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(render_labels_file(kept))
    tmp.replace(args.out)  # readers never see half a file
    print(f"node {args.node}: {len(kept)} topology labels -> {args.out}: "
          + (", ".join(f"{k}={v}" for k, v in kept.items()) or "(none)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
