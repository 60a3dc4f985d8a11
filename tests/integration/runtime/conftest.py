"""Shared fixtures: one simulated Ray cluster for the package (startup costs seconds).

Cluster: a CPU-only head plus GPU nodes with fake GPUs, labelled `meshyard.io/node` so the
runtime joins them with the declared topology written next to the database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from orchestrator.lifecycle import JobState  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from orchestrator.spec import parse_spec  # noqa: E402
from orchestrator.store import open_store  # noqa: E402
from orchestrator.store.repo import Store  # noqa: E402

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
        "fault_tolerance": {"max_failures": 1, "init_timeout_s": 60, "collective_timeout_s": 30},
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


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Cluster]:
    """One cluster for the whole package (a start costs 10-35 s on this loaded machine):
    head (1 CPU), n1 and n2 (2 fake GPUs each), c1 (CPU only, where CPU jobs and the warm
    pool go). Tests leave no job running; the runtime sweeps what a failed test left."""
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for name, n in GPU_NODES.items():
            cluster.add_node(num_cpus=2, num_gpus=n["gpus"],
                             labels={"meshyard.io/node": name, "leaf": n["leaf"]})
        cluster.add_node(num_cpus=2, labels={"meshyard.io/node": "c1"})
        ray.init(address=cluster.address, namespace="meshyard", log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


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
    return Settings(data_dir=tmp_path, ray_address=ray_cluster.address,
                    cluster_file=write_cluster_file(tmp_path / "cluster.yaml"),
                    allow_fault_injection=True)


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


def submit(store: Store, spec: dict[str, Any]) -> str:
    job, _ = store.submit_job(parse_spec(spec), owner="admin")
    return job.id


def wait_for(store: Store, job_id: str, pred: Callable[[Any], bool], *,
             timeout_s: float = 180.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    job = store.get_job(job_id)
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job is not None and pred(job):
            return job
        time.sleep(0.2)
    events = [(e.kind, e.src, e.dst, e.reason, e.message[:300]) for e in store.list_events(job_id)]
    raise AssertionError(f"{job_id} never reached {what}: state {job.state if job else None}, "
                         f"pending {job.pending_reason if job else None}, "
                         f"events {events}")


def wait_state(store: Store, job_id: str, *states: JobState, timeout_s: float = 180.0) -> Any:
    return wait_for(store, job_id, lambda j: j.state in states, timeout_s=timeout_s,
                    what="/".join(states))


def start_serve(data_dir: Path, *, token: str, address: str | None = None,
                cluster_file: Path | None = None,
                extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """A real `meshyard serve` subprocess on a free port, in its own session (its process
    group is it and what it started). Joined to the Ray cluster at `address`, or with
    `address` None on its embedded defaults: its own local Ray and none of this process's
    MESHYARD_* / RAY_* settings. Its warm pool is the default one, without the prestarted
    user-code rank process: the callers run built-in jobs only, so those processes (each
    importing torch) would never be used."""
    data_dir.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "meshyard"
    env = {k: v for k, v in os.environ.items()
           if address is not None or not k.startswith(("MESHYARD_", "RAY_"))}
    env.update(MESHYARD_ADMIN_TOKEN=token, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               MESHYARD_WARM_POOL_USER_CODE="0")
    args = [str(exe), "serve", "--port", "0", "--data-dir", str(data_dir), "--no-access-log"]
    if address is not None:
        args += ["--ray-address", address]
    if cluster_file is not None:
        args += ["--cluster-file", str(cluster_file)]
    log = open(data_dir / "serve.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([*args, *extra], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop_serve(proc: subprocess.Popen[bytes], *, timeout_s: float = 30) -> None:
    """SIGTERM (graceful shutdown), then SIGKILL if it has not exited within `timeout_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def serve_url(data_dir: Path, proc: subprocess.Popen[bytes], *, token: str | None = None,
              timeout_s: float = 60) -> str:
    """The URL `proc` wrote to server.json; with `token`, also waits until it answers."""
    from api.client import MeshyardClient

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, (data_dir / "serve.log").read_text()[-3000:]
        try:
            info = json.loads((data_dir / "server.json").read_text())
            if info["pid"] == proc.pid:
                if token is None:
                    return str(info["url"])
                with MeshyardClient(str(info["url"]), token) as client:
                    if client.healthy():  # listening once the runtime has started
                        return str(info["url"])
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError("server did not start: " + (data_dir / "serve.log").read_text()[-3000:])
