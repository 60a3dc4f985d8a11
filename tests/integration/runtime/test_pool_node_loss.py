"""The warm pool's own actor goes on the control plane's node, and a pool whose node died is
replaced by the next start (`ensure_pool`), not waited on until the start fails.

Own cluster (a head and one more node): the test removes a node, which the package's shared
cluster must keep. The pool holds no warm actors here (size 0): what is tested is the pool
actor itself, not the torch-importing workers it fills nodes with (test_warm_pool.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from orchestrator.runtime.events import NAMESPACE
from orchestrator.runtime.pool import ensure_pool, find_pool
from tests.integration.runtime.conftest import NODE_ARGS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture()
def two_nodes() -> Iterator[tuple[Cluster, Any]]:
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False, **NODE_ARGS})
    try:
        other = cluster.add_node(num_cpus=1, **NODE_ARGS)
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster, other
    finally:
        ray.shutdown()
        cluster.shutdown()


def _node_of(actor: Any) -> str:
    return str(ray.get(actor.__ray_call__.remote(
        lambda _self: ray.get_runtime_context().get_node_id()), timeout=60))


def test_a_pool_whose_node_died_is_replaced_on_the_control_plane_node(
        two_nodes: tuple[Cluster, Any]) -> None:
    cluster, other = two_nodes
    head = ray.get_runtime_context().get_node_id()  # this driver's node: the control plane's
    assert other.node_id != head

    first = ensure_pool(0, prestart=False, near_node_id=other.node_id, timeout_s=120)
    assert _node_of(first) == other.node_id  # a hard affinity: where it was asked to go

    cluster.remove_node(other)  # the pool's node dies (its raylet and workers are killed)

    second = ensure_pool(0, prestart=False, near_node_id=head, timeout_s=120)
    assert _node_of(second) == head
    status = ray.get(second.status.remote(), timeout=30)
    assert status["size"] == 0 and not status["draining"]
    assert list(status["nodes"]) == [head]  # the dead node is no longer filled
    found = find_pool()
    assert found is not None and _node_of(found) == head
