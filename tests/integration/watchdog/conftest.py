"""One single-node Ray for the package's modules that run jobs through a Runtime
(test_runtime_hangs.py, test_user_hangs.py), started once per pytest process.

The head runs as its own processes (ray.cluster_utils.Cluster), not as a `ray.init()` local
cluster owned by this process: the end of every module disconnects this process from Ray
(tests/conftest.py), which would stop a driver-owned cluster. Each module connects with
`ray_connected`, builds the Runtime its tests need (the two modules' settings differ: fault
injection and a pool without prestarted rank processes for one, the REST service with the
default pool for the other) and stops it; the Runtime's stop drains its warm pool, so the
next module fills its own. Under `make test` both modules go to the same xdist worker
(tests/conftest.py, XDIST_GROUPS), so the cluster starts once in the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from orchestrator.runtime.events import NAMESPACE  # noqa: E402
from orchestrator.runtime.service import DEFAULT_WORKER_PORTS  # noqa: E402
from workers.host import setup_worker  # noqa: E402

# 4 CPUs as the modules' local Ray had; worker processes in the port range a local Ray
# started by meshyard uses (isolated mode refuses user code on a node without one), started
# through meshyard's setup worker as there.
HEAD = {"num_cpus": 4, "include_dashboard": False,
        "min_worker_port": DEFAULT_WORKER_PORTS[0], "max_worker_port": DEFAULT_WORKER_PORTS[1],
        **setup_worker.ray_params()}


@pytest.fixture(scope="package")
def watchdog_ray() -> Iterator[Cluster]:
    cluster = Cluster(initialize_head=True, head_node_args=dict(HEAD))
    try:
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()  # the head's processes, by the handles this process holds


@pytest.fixture(scope="module")
def ray_connected(watchdog_ray: Cluster) -> Iterator[Cluster]:
    """This process connected to the package's Ray for one module (a Runtime started after
    it joins this connection instead of starting a Ray of its own)."""
    if not ray.is_initialized():
        ray.init(address=watchdog_ray.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield watchdog_ray
    finally:
        ray.shutdown()  # this process's connection; the cluster stays for the next module
