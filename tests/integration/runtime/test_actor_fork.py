"""Worker actors under Ray come from the fork server (workers/host/forkserver.py): forked from
a process that imported torch, with the environment, resources and working directory Ray
gave them, and gone with the process Ray started for them."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import psutil
import ray
from ray.cluster_utils import Cluster

from tests.support.processes import gone
from workers.host.forkserver import runtime_env


@ray.remote
class Probe:
    def __init__(self) -> None:
        self.torch_at_start = "torch" in sys.modules
        from workers.host.forkserver import apply_thread_counts

        apply_thread_counts()

    def info(self) -> dict[str, Any]:
        import numpy
        import torch

        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                "torch_at_start": self.torch_at_start, "threads": torch.get_num_threads(),
                "omp": os.environ.get("OMP_NUM_THREADS"), "mine": os.environ.get("MINE"),
                "raylet": os.environ.get("RAY_RAYLET_PID"), "node": ctx.get_node_id(),
                "worker": ctx.get_worker_id(), "random": int(numpy.random.randint(0, 2**31)),
                "marker": os.path.exists("marker.txt")}


def _client_of(worker_id: str) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(c.endswith("forkserver_client.py") for c in cmd) \
                and f"--worker-id={worker_id}" in cmd:
            return p
    return None


def test_worker_actors_are_forked_with_what_ray_gave_them(ray_connected: Cluster,
                                                          tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "marker.txt").write_text("here")
    from ray._private.runtime_env.packaging import (
        create_package,
        get_uri_for_directory,
        upload_package_to_gcs,
    )

    uri = get_uri_for_directory(str(code), include_gitignore=False)
    create_package(str(code), tmp_path / "code.zip", include_gitignore=False)
    upload_package_to_gcs(uri, (tmp_path / "code.zip").read_bytes())
    env = runtime_env({"env_vars": {"MINE": "1"}, "working_dir": uri})
    actors = [Probe.options(num_cpus=0.25, runtime_env=env).remote() for _ in range(2)]
    infos = ray.get([a.info.remote() for a in actors], timeout=180)
    try:
        for info in infos:
            parent = psutil.Process(info["ppid"])
            assert any("workers.host.forkserver" in c for c in parent.cmdline()), \
                parent.cmdline()
            assert info["torch_at_start"] is True  # the server imported it
            assert info["mine"] == "1"  # runtime_env env_vars
            assert info["omp"] == "1" and info["threads"] == 1  # Ray's OMP_NUM_THREADS
            assert info["marker"] is True  # started in Ray's copy of the working_dir
            # the client Ray started is the raylet's child, and holds the worker's id
            client = _client_of(info["worker"])
            assert client is not None
            assert str(client.ppid()) == info["raylet"]
        assert infos[0]["worker"] != infos[1]["worker"]
        assert infos[0]["random"] != infos[1]["random"]  # numpy reseeded in each fork
    finally:
        clients = [_client_of(i["worker"]) for i in infos]
        for a in actors:
            ray.kill(a, no_restart=True)
    for info, client in zip(infos, clients, strict=True):
        assert gone([info["pid"]], timeout_s=60), "the worker outlived ray.kill"
        assert client is not None
        assert gone([client.pid], timeout_s=60), "its client outlived ray.kill"
