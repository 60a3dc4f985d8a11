"""The label flow, executed: node labels → init container → file → `meshyard topo labels` →
`ray start --labels`, running the commands exactly as the rendered RayCluster has them.

A local HTTP server on 127.0.0.1 stands in for the Kubernetes API (no cluster runs here); it
checks the bearer token and serves the node object.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.topology.labels import levels_from_node_labels, parse_labels_text
from tests.unit.deploy.k8s_render import DEPLOY, ROOT, find

SCRIPT = DEPLOY / "scripts" / "k8s_node_labels.py"
VENV_BIN = Path(sys.executable).parent
NODE = "gpu-node-7"
TOKEN = "test-sa-token"
NODE_LABELS = {
    "kubernetes.io/hostname": NODE,
    "node.kubernetes.io/instance-type": "a4x-highgpu-4g",
    "nvidia.com/gpu.clique": "6f1e0b2c.3",
    "nvidia.com/gpu.product": "NVIDIA-GB200",
    "cloud.google.com/gce-topology-block": "blk-a",
    "cloud.google.com/gce-topology-subblock": "sb-2",
    "network.topology.nvidia.com/spine": "spine-0",
    "topology.k8s.aws/network-node-layer-3": "",  # empty values are dropped
}


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("k8s_node_labels", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nl = _load_script()


@pytest.fixture
def fake_api() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(f"{self.path} {self.headers.get('Authorization')}")
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(403)
                self.end_headers()
                return
            if self.path != f"/api/v1/nodes/{NODE}":
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps({"kind": "Node", "metadata": {"name": NODE,
                                                           "labels": NODE_LABELS}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("key,kept", [
    ("nvidia.com/gpu.clique", True), ("nvidia.com/gpu.product", False),
    ("cloud.google.com/gce-topology-block", True), ("cloud.google.com/gke-nodepool", False),
    ("topology.k8s.aws/network-node-layer-1", True), ("topology.k8s.aws/zone-id", False),
    ("network.topology.nvidia.com/accelerator", True), ("meshyard.io/rack", True),
    ("kubernetes.io/hostname", False)])
def test_topology_key_filter(key: str, kept: bool) -> None:
    assert nl.is_topology_key(key) is kept


def test_file_round_trips_through_meshyards_parser() -> None:
    kept = nl.topology_labels(NODE_LABELS)
    assert parse_labels_text(nl.render_labels_file(kept)) == kept
    assert levels_from_node_labels(kept) == {
        "nvlink_domain": "6f1e0b2c.3", "subblock": "sb-2", "block": "blk-a", "spine": "spine-0"}


def _pod(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ray = find(rendered["dev"], "RayCluster")
    pod: dict[str, Any] = ray["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    return pod


def test_rendered_worker_commands_publish_node_levels(
        rendered: dict[str, list[dict[str, Any]]], fake_api: tuple[str, list[str]],
        tmp_path: Path) -> None:
    url, seen = fake_api
    pod = _pod(rendered)
    init, worker = pod["initContainers"][0], pod["containers"][0]
    sa_dir = tmp_path / "sa"
    sa_dir.mkdir()
    (sa_dir / "token").write_text(TOKEN + "\n")
    labels_dir = tmp_path / "etc-meshyard"
    # The init container, as rendered; only the file's directory moves into tmp.
    args = [a.replace("/etc/meshyard", str(labels_dir)) for a in init["args"]]
    env = dict(os.environ, MESHYARD_K8S_API_URL=url, MESHYARD_NODE_NAME=NODE)
    out = subprocess.run([sys.executable, str(SCRIPT), *args, "--sa-dir", str(sa_dir)],
                         env=env, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert seen == [f"/api/v1/nodes/{NODE} Bearer {TOKEN}"]
    labels_file = labels_dir / "node-labels"
    assert "gpu.product" not in labels_file.read_text()

    # The Ray worker container, as rendered, with KubeRay's generated command echoed.
    wenv = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}", MESHYARD_NODE_NAME=NODE,
                MESHYARD_NODE_LABELS_FILE=str(labels_file), PYTHONPATH=str(ROOT),
                KUBERAY_GEN_RAY_START_CMD="echo ray start --address=meshyard-ray-head-svc:6379 "
                                          "--block")
    # `bash -lc` as rendered, minus the login profile: here /etc/profile would reset PATH
    # and hide the venv (in the image meshyard sits in /usr/local/bin, on that PATH).
    assert worker["command"] == ["/bin/bash", "-lc", "--"]
    run = subprocess.run(["/bin/bash", "-c", "--", *worker["args"]], env=wenv, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    start = run.stdout.strip().splitlines()[-1]
    assert start == ("ray start --address=meshyard-ray-head-svc:6379 --block "
                     f"--labels=meshyard.io/node={NODE},nvlink_domain=6f1e0b2c.3,"
                     "subblock=sb-2,block=blk-a,spine=spine-0")


def test_init_container_fails_loudly_without_access(
        fake_api: tuple[str, list[str]], tmp_path: Path) -> None:
    url, _ = fake_api
    sa_dir = tmp_path / "sa"
    sa_dir.mkdir()
    (sa_dir / "token").write_text("wrong")
    out = subprocess.run([sys.executable, str(SCRIPT), "--node", NODE, "--out",
                          str(tmp_path / "labels"), "--sa-dir", str(sa_dir)],
                         env=dict(os.environ, MESHYARD_K8S_API_URL=url),
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 1
    assert "get nodes" in out.stderr and "403" in out.stderr
    assert not (tmp_path / "labels").exists()
