"""Ranks from where the worker actors really landed (Ray picks GPU indices inside a node)."""

import pytest

from orchestrator.placement.gang_plan import Bundle
from orchestrator.placement.ranks import bundle_ranks


def _bundle(rank: int, node_id: str, gpu: int | None) -> Bundle:
    return Bundle(rank=rank, node=node_id, node_id=node_id, gpu=gpu, coords={}, cpus=1.0)


def test_ranks_follow_the_planned_gpu_order_on_each_node():
    bundles = [_bundle(r, n, g)
               for r, (n, g) in enumerate([("a", 0), ("a", 1), ("b", 4), ("b", 5)])]
    # Ray handed out other GPU indices, in another order
    landed = [("a", 3), ("a", 2), ("b", 0), ("b", 1)]
    assert bundle_ranks(bundles=bundles, landed=landed) == {1: 0, 0: 1, 2: 2, 3: 3}


def test_a_bundle_on_the_wrong_node_is_an_error():
    with pytest.raises(ValueError, match="label selector"):
        bundle_ranks(bundles=[_bundle(0, "a", 0)], landed=[("b", 0)])


def test_cpu_bundles_keep_their_planned_rank():
    bundles = [_bundle(1, "a", None), _bundle(0, "a", None)]
    landed = [("a", None), ("a", None)]
    assert bundle_ranks(bundles=bundles, landed=landed) == {0: 1, 1: 0}
