"""Shared fixtures: one simulated Ray cluster for the package (startup costs seconds).

Cluster: a CPU-only head plus GPU nodes with fake GPUs, labelled `meshyard.io/node` so the
runtime joins them with the declared topology written next to the database.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from orchestrator.settings import Settings  # noqa: E402
from orchestrator.store import open_store  # noqa: E402
from orchestrator.store.repo import Store  # noqa: E402

# The package's modules import these from here; they live in tests/support/.
from tests.support.jobs import submit, wait_for, wait_state  # noqa: E402, F401
from tests.support.serve import serve_url, start_serve, stop_serve  # noqa: E402, F401
from workers.host import setup_worker  # noqa: E402

# Every simulated node as meshyard starts its nodes (orchestrator/runtime/service.py
# init_local_ray, deploy/baremetal/ray-node.sh): worker processes in a known port range
# (isolated mode refuses user code on a node without one), started through meshyard's setup
# worker (workers/host/setup_worker.py).
NODE_ARGS = {"min_worker_port": 10002, "max_worker_port": 19999, **setup_worker.ray_params()}
GPU_NODES = {"n1": {"gpus": 2, "leaf": "l0"}, "n2": {"gpus": 2, "leaf": "l1"}}

TINY_MODEL = {"kind": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 32, "vocab_size": 64,
              "seq_len": 16}


def tiny_spec(name: str, **over: Any) -> dict[str, Any]:
    """A job that trains in a few seconds on CPU (fake GPUs fall back to cpu/gloo)."""
    spec: dict[str, Any] = {
        "name": name, "parallelism": {"dp_replicate": 2},
        "resources": {"cpus_per_worker": 0.25},
        "model": dict(TINY_MODEL),
        "training": {"steps": 6, "micro_batch_size": 2, "lr": 0.01},
        "checkpoint": {"enabled": True, "every_steps": 2, "async_save": False},
        # start and first step within 180 s: cold workers import torch on a loaded host
        "fault_tolerance": {"max_failures": 1, "init_timeout_s": 180, "collective_timeout_s": 30},
    }
    for key, value in over.items():
        if key not in ("parallelism", "model") and isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def write_cluster_file(path: Path, nodes: dict[str, dict[str, Any]] = GPU_NODES) -> Path:
    doc = {"levels": ["leaf"], "nodes": [
        {"name": name, "gpus": n["gpus"], "intra_node": "nvswitch", "labels": {"leaf": n["leaf"]}}
        for name, n in nodes.items()]}
    path.write_text(yaml.safe_dump(doc))
    return path


@contextlib.contextmanager
def package_cluster() -> Iterator[Cluster]:
    """The package's simulated cluster, this process connected to it: head (1 CPU), n1 and
    n2 (2 fake GPUs each), c1 (CPU only, where CPU jobs and the warm pool go). Disconnected and
    stopped at the end of the block (bench/ray_telemetry.py measures on it too)."""
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False, **NODE_ARGS})
    try:
        for name, n in GPU_NODES.items():
            cluster.add_node(num_cpus=2, num_gpus=n["gpus"], **NODE_ARGS,
                             labels={"meshyard.io/node": name, "leaf": n["leaf"]})
        cluster.add_node(num_cpus=2, labels={"meshyard.io/node": "c1"}, **NODE_ARGS)
        ray.init(address=cluster.address, namespace="meshyard", log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Cluster]:
    """One cluster for the whole package (a start costs 10-35 s on this loaded machine).
    Tests leave no job running; the runtime sweeps what a failed test left."""
    with package_cluster() as cluster:
        yield cluster


@pytest.fixture()
def ray_connected(ray_cluster: Cluster) -> Cluster:
    """This process connected to the package's cluster. The end of every module disconnects
    it (tests/conftest.py), and a bare Ray API call would then join whichever Ray instance on
    the host started last (another engineer's, on a shared machine)."""
    if not ray.is_initialized():
        ray.init(address=ray_cluster.address, namespace="meshyard", log_to_driver=False)
    return ray_cluster


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'meshyard.db'}")
    yield s
    s.close()


@pytest.fixture()
def settings(tmp_path: Path, ray_cluster: Cluster) -> Settings:
    return package_settings(tmp_path, ray_cluster)


def package_settings(tmp_path: Path, ray_cluster: Cluster, **overrides: Any) -> Settings:
    """The package's settings (a module's `settings` fixture may override some). No spare
    controller: each runtime would start one more controller process than its jobs use
    (test_spare_controllers.py keeps one and tests them). No node sampling: a runtime that
    lives past the first interval starts one sampler actor per node (a Ray worker process
    each) for samples its test never reads (test_node_usage.py and test_job_insight.py
    sample and read them)."""
    fields: dict[str, Any] = dict(
        data_dir=tmp_path, ray_address=ray_cluster.address,
        cluster_file=write_cluster_file(tmp_path / "cluster.yaml"),
        allow_fault_injection=True, spare_controllers=0, node_usage_interval_s=0)
    return Settings(**(fields | overrides))


@pytest.fixture()
def runtime(settings: Settings, store: Store) -> Iterator[Any]:
    from orchestrator.runtime.service import Runtime

    # Cold starts: filling the default pool (one actor and one prestarted rank process per
    # node, each importing torch) for every test would cost ~8 torch imports a test; the
    # pooled path has its own tests (test_warm_pool.py, the hang modules' warm_pool=3, the
    # `meshyard serve` and browser runtime tests, whose pools keep no prestarted rank
    # process, and the secrets and `make run` tests, which run the full default).
    rt = Runtime(settings, store, tick_s=0.2, warm_pool=0)
    rt.start()
    try:
        yield rt
    finally:
        rt.stop()


# A real S3-compatible server per module that asks for it (tests/support/s3.py).
from tests.support.s3 import s3, storage  # noqa: E402, F401
