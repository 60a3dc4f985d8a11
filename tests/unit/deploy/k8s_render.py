"""Rendering deploy/kubernetes overlays with the real kubectl (kustomize built in)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
OVERLAYS = ("dev", "prod")
NAMESPACES = {"dev": "meshyard-dev", "prod": "meshyard"}


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl is required to render the kustomize overlays (it is on the machine " \
        "image; install kubectl >= 1.27, which has kustomize v5 built in)"
    return path


def render_overlay(overlay: str, work: Path) -> list[dict[str, Any]]:
    """Renders a copy of deploy/kubernetes, with the dev secrets.env made from its example
    (the real one is never committed), and parses every document."""
    tree = work / "kubernetes"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets.env"))
    for example in tree.glob("overlays/*/secrets.env.example"):
        shutil.copy(example, example.with_suffix(""))
    out = subprocess.run([kubectl(), "kustomize", str(tree / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def pod_specs(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) for every pod template in a workload or RayCluster."""
    kind, name = doc["kind"], doc["metadata"]["name"]
    spec = doc.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        yield f"{kind}/{name}", spec["template"]["spec"]
    elif kind == "RayCluster":
        yield f"{kind}/{name}/head", spec["headGroupSpec"]["template"]["spec"]
        for group in spec.get("workerGroupSpecs", []):
            yield f"{kind}/{name}/{group['groupName']}", group["template"]["spec"]


def containers(pod: dict[str, Any]) -> Iterator[tuple[bool, dict[str, Any]]]:
    """(is_init, container) for every container of a pod spec."""
    for c in pod.get("initContainers", []):
        yield True, c
    for c in pod.get("containers", []):
        yield False, c


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]
