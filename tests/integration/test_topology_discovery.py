"""Discovery on a real local multi-node Ray cluster: one task pinned to every node."""

from __future__ import annotations

import os

import pytest

from orchestrator.topology.discovery import cluster_from_discovery

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_node_cluster():
    key = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved = os.environ.get(key)
    os.environ[key] = "0"  # every node on 127.0.0.1
    import ray
    from ray.cluster_utils import Cluster

    from workers.host import setup_worker

    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, **setup_worker.ray_params()})
    try:
        cluster.add_node(num_cpus=1, num_gpus=2, **setup_worker.ray_params(),
                         labels={"leaf": "leaf-a", "network.topology.nvidia.com/spine": "s0"})
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield ray, cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def test_discovery_task_runs_on_every_node(two_node_cluster):
    ray, _ = two_node_cluster
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    from orchestrator.runtime.nodes import discover_cluster

    results = discover_cluster(timeout_s=60,
                               options={"nvidia_smi": "nvidia-smi", "ib_root": None})
    assert set(results) == {n["NodeID"] for n in nodes}
    for nid, res in results.items():
        assert "error" not in res, res
        assert res["node_id"] == nid  # the task really ran where it was pinned
        assert res["topology"]["gpus"] == []  # no real GPU on this machine

    c = cluster_from_discovery(results, ray.nodes())
    assert c.levels == ("leaf", "spine")
    worker = next(n for n in c.nodes if n.labels.get("leaf") == "leaf-a")
    assert worker.free_gpus == (0, 1)  # Ray's simulated GPUs, links unknown
    assert dict(worker.labels) == {"leaf": "leaf-a", "spine": "s0"}
    assert len({n.name for n in c.nodes}) == 2
