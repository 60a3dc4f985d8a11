"""Rank -> node / GPU / NVLink domain / switch labels / mesh coordinates."""

from __future__ import annotations

from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology
from orchestrator.watchdog.locate import mesh_coords, rank_locations


def test_mesh_coords_tp_fastest_pp_slowest() -> None:
    dims = {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    assert mesh_coords(5, dims) == {"pp": 1, "dp_shard": 0, "tp": 1}
    assert mesh_coords(0, dims) == {"pp": 0, "dp_shard": 0, "tp": 0}
    assert mesh_coords(7, dims) == {"pp": 1, "dp_shard": 1, "tp": 1}
    assert mesh_coords(3, {}) == {}


def test_rank_locations_from_topology() -> None:
    # Two PCIe pairs joined by NVLink inside each node (NV2 on 0-1, 2-3), two leaf switches.
    node_topo = NodeTopology.uniform(4, "PHB")
    links = dict(node_topo.links)
    links[(0, 1)] = "NV2"
    links[(2, 3)] = "NV2"
    topo = NodeTopology(gpus=node_topo.gpus, links=links)
    cluster = ClusterTopology(levels=("leaf", "spine"), nodes=(
        ClusterNode(name="a", topology=topo, labels={"leaf": "l0", "spine": "s0"}),
        ClusterNode(name="b", topology=topo, labels={"leaf": "l1", "spine": "s0"})))
    locs = rank_locations(assignment={0: ("a", 0), 1: ("a", 1), 2: ("b", 3), 3: ("zz", 0)},
                          topology=cluster, mesh_dims={"dp_shard": 2, "tp": 2})
    assert dict(locs[1].labels) == {"nvlink_domain": "a/nvl0", "leaf": "l0", "spine": "s0"}
    assert dict(locs[2].labels) == {"nvlink_domain": "b/nvl2", "leaf": "l1", "spine": "s0"}
    assert dict(locs[3].labels) == {}  # unknown node: no labels, still a location
    assert locs[2].describe() == "b GPU 3, dp_shard 1, tp 0"
