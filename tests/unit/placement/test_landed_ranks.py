import pytest

from orchestrator.mesh import MeshShape
from orchestrator.placement.ranks import bundle_ranks


def test_ranks_follow_the_planned_gpu_order_on_each_node():
    bundles = [{"rank": r, "node_id": n, "gpu": g}
               for r, (n, g) in enumerate([("a", 0), ("a", 1), ("b", 4), ("b", 5)])]
    # Ray handed out other GPU indices, in another order
    landed = [{"node_id": "a", "gpu_ids": [3]}, {"node_id": "a", "gpu_ids": [2]},
              {"node_id": "b", "gpu_ids": [0]}, {"node_id": "b", "gpu_ids": [1]}]
    assert bundle_ranks(bundles=bundles, landed=landed) == {1: 0, 0: 1, 2: 2, 3: 3}


def test_a_bundle_on_the_wrong_node_is_an_error():
    with pytest.raises(ValueError, match="label selector"):
        bundle_ranks(bundles=[{"rank": 0, "node_id": "a", "gpu": 0}],
                     landed=[{"node_id": "b", "gpu_ids": [0]}])


def test_cpu_bundles_keep_their_planned_rank():
    bundles = [{"rank": 1, "node_id": "a", "gpu": None}, {"rank": 0, "node_id": "a", "gpu": None}]
    landed = [{"node_id": "a", "gpu_ids": []}, {"node_id": "a", "gpu_ids": []}]
    assert bundle_ranks(bundles=bundles, landed=landed) == {0: 1, 1: 0}


def test_mesh_coords_tp_fastest():
    assert MeshShape(pp=2, dp_shard=2, tp=2).coords(5) == \
        {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "tp": 1}
