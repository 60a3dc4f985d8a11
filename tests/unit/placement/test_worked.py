"""Worked placement scenarios, plus failures and the actor mapping."""

from __future__ import annotations

import pytest

from orchestrator.mesh import MeshShape
from orchestrator.placement.blocks import candidates
from orchestrator.placement.domains import Packing, build_tree
from orchestrator.placement.failure import FailureReason, PlacementFailure
from orchestrator.placement.ranks import assign_ranks, best_tp_groups, ranks_for_actors
from orchestrator.placement.solver import Constraints, Placement, solve
from orchestrator.topology.model import ClusterNode, ClusterTopology
from tests.unit.placement.clusters import cluster, dgx1, islands, nvswitch, p40_pcie, pcie


def placed(result: Placement | PlacementFailure) -> Placement:
    assert isinstance(result, Placement), result
    return result


def tp_sets(p: Placement) -> list[set[tuple[str, int]]]:
    return [{(p.ranks[r].node, p.ranks[r].gpu) for r in g} for g in p.mesh.groups("tp")]


def test_two_nvswitch_nodes_tp8_dp2_one_group_per_node_rail_aligned() -> None:
    c = cluster([("node-a", nvswitch(), {"leaf": "l0"}, []),
                 ("node-b", nvswitch(), {"leaf": "l0"}, [])])
    p = placed(solve(c, MeshShape(tp=8, dp_replicate=2)))
    assert [(r.node, r.gpu) for r in p.ranks[:8]] == [("node-a", g) for g in range(8)]
    assert [(r.node, r.gpu) for r in p.ranks[8:]] == [("node-b", g) for g in range(8)]
    assert p.mesh.groups("dp_replicate") == [(i, i + 8) for i in range(8)]
    for a, b in p.mesh.groups("dp_replicate"):  # (0, 8), (1, 9), ...: same local GPU
        assert p.ranks[a].gpu == p.ranks[b].gpu and p.ranks[a].node != p.ranks[b].node
    dims = {d.dimension: d for d in p.estimate.dimensions}
    assert dims["tp"].bottleneck == "NV18" and dims["dp_replicate"].bottleneck == "IB@leaf"


def test_dgx1_tp4_gives_nvlink_complete_quads() -> None:
    c = cluster([("dgx1", dgx1(), {"leaf": "l0"}, [])])
    p = placed(solve(c, MeshShape(tp=4, dp_replicate=2)))
    assert tp_sets(p) == [{("dgx1", g) for g in (0, 1, 2, 3)}, {("dgx1", g) for g in (4, 5, 6, 7)}]
    assert best_tp_groups(dgx1(), range(8), 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_dgx1_single_quad_picks_a_complete_quad_and_avoids_busy() -> None:
    free = cluster([("dgx1", dgx1(), {}, [])], levels=())
    assert placed(solve(free, MeshShape(tp=4))).gpus_by_node() == {"dgx1": [0, 1, 2, 3]}
    busy = cluster([("dgx1", dgx1(), {}, [1])], levels=())
    assert placed(solve(busy, MeshShape(tp=4))).gpus_by_node() == {"dgx1": [4, 5, 6, 7]}


def test_dgx1_tp2_pairs_use_double_nvlinks() -> None:
    topo = dgx1()
    p = placed(solve(cluster([("dgx1", topo, {}, [])], levels=()), MeshShape(tp=2, dp_shard=4)))
    for group in tp_sets(p):
        a, b = sorted(g for _, g in group)
        assert topo.link(a, b) == "NV2"


def test_pcie_box_pairs_are_pix_before_pxb() -> None:
    topo = p40_pcie()
    node = Constraints(tp_within="node")  # no NVLink: the default tp_within cannot hold
    p = placed(solve(cluster([("p40", topo, {}, [])], levels=()), MeshShape(tp=2, dp_shard=4),
                     constraints=node))
    for group in tp_sets(p):
        a, b = sorted(g for _, g in group)
        assert topo.link(a, b) == "PIX"
    # one pair wanted while GPUs 0 and 5 are busy: a PIX pair, never a PXB one
    c = cluster([("p40", topo, {}, [0, 5])], levels=())
    a, b = placed(solve(c, MeshShape(tp=2), constraints=node)).gpus_by_node()["p40"]
    assert topo.link(a, b) == "PIX"


def test_fragmented_cluster_bestfit_keeps_job_on_one_node() -> None:
    # free: node-a 3, node-b 5, node-c 4. A PACK-like spread would straddle a and b;
    # BestFit takes node-c, the tightest node that holds the whole job.
    c = cluster([("node-a", nvswitch(), {"leaf": "l0"}, [0, 1, 2, 3, 4]),
                 ("node-b", nvswitch(), {"leaf": "l0"}, [0, 1, 2]),
                 ("node-c", nvswitch(), {"leaf": "l0"}, [4, 5, 6, 7])])
    p = placed(solve(c, MeshShape(tp=2, dp_shard=2)))
    assert p.nodes == ("node-c",) and p.level == "node"
    assert p.gpus_by_node() == {"node-c": [0, 1, 2, 3]}


def test_two_leaves_two_node_job_stays_under_one_leaf() -> None:
    # cluster order interleaves the leaves; leaf-b is the tightest leaf that holds the job.
    c = cluster([("a1", nvswitch(), {"leaf": "leaf-a", "spine": "s0"}, []),
                 ("b1", nvswitch(), {"leaf": "leaf-b", "spine": "s0"}, []),
                 ("a2", nvswitch(), {"leaf": "leaf-a", "spine": "s0"}, []),
                 ("b2", nvswitch(), {"leaf": "leaf-b", "spine": "s0"}, []),
                 ("a3", nvswitch(), {"leaf": "leaf-a", "spine": "s0"}, [])],
                levels=("leaf", "spine"))
    p = placed(solve(c, MeshShape(tp=8, dp_replicate=2)))
    assert set(p.nodes) == {"b1", "b2"} and p.level == "leaf" and p.domain == ("s0", "leaf-b")
    dims = {d.dimension: d for d in p.estimate.dimensions}
    assert dims["dp_replicate"].bottleneck == "IB@leaf"


def test_pp_stages_across_nodes_dp_shard_inside_node() -> None:
    c = cluster([("node-a", nvswitch(), {"leaf": "l0"}, []),
                 ("node-b", nvswitch(), {"leaf": "l0"}, [])])
    p = placed(solve(c, MeshShape(pp=2, dp_shard=2, tp=4)))
    assert {r.node for r in p.ranks if r.coords["pp"] == 0} == {"node-a"}
    assert {r.node for r in p.ranks if r.coords["pp"] == 1} == {"node-b"}
    for a, b in p.mesh.groups("pp"):
        assert p.ranks[a].gpu == p.ranks[b].gpu  # stages meet on the same rail


def test_issue_message_for_fragmented_nvlink_domains() -> None:
    c = cluster([("node-a", nvswitch(), {"leaf": "l0"}, [0, 1, 2]),
                 ("node-b", nvswitch(), {"leaf": "l0"}, [5, 6, 7]),
                 ("node-c", nvswitch(), {"leaf": "l0"}, [6, 7])])  # 16 free: 5 + 5 + 6
    f = solve(c, MeshShape(tp=8, dp_replicate=2))
    assert isinstance(f, PlacementFailure) and f.reason == FailureReason.FRAGMENTED
    assert f.retryable
    assert "each of the 2 TP groups needs 8 GPUs inside one NVLink domain" in f.message
    assert "the largest free NVLink domain has 6, on node-c" in f.message
    relaxed = placed(solve(c, MeshShape(tp=8, dp_replicate=2),
                           constraints=Constraints(mode="preferred")))
    assert relaxed.relaxed and any("spans nodes" in n for n in relaxed.notes)


def test_never_fits_versus_waiting() -> None:
    two = [("node-a", pcie(), {"leaf": "l0"}, [0, 1]), ("node-b", pcie(), {"leaf": "l0"}, [])]
    f = solve(cluster(two), MeshShape(tp=2))
    assert isinstance(f, PlacementFailure) and f.reason == FailureReason.TP_DOMAIN_TOO_SMALL
    assert not f.retryable and "tp_within=node" in f.message
    f = solve(cluster(two), MeshShape(dp_shard=17))
    assert f.reason == FailureReason.INFEASIBLE and "cluster has 16" in f.message  # type: ignore[union-attr]
    f = solve(cluster(two), MeshShape(dp_shard=15))
    assert f.reason == FailureReason.INSUFFICIENT_FREE and f.retryable  # type: ignore[union-attr]
    assert "14 are free now" in f.message  # type: ignore[union-attr]
    six = [("n1", islands(6, 6), {}, []), ("n2", islands(6, 6), {}, [])]
    f = solve(cluster(six, levels=()), MeshShape(tp=4, dp_shard=3))  # 12 GPUs, 2 groups fit
    assert f.reason == FailureReason.INFEASIBLE and "holds only 2 TP groups" in f.message  # type: ignore[union-attr]


def test_nvlink_islands_inside_a_node() -> None:
    c = cluster([("n", islands(8, 4), {}, [0])], levels=())
    f = solve(c, MeshShape(tp=4, dp_shard=2))
    assert isinstance(f, PlacementFailure) and f.reason == FailureReason.INSUFFICIENT_FREE
    p = placed(solve(c, MeshShape(tp=4)))
    assert p.gpus_by_node() == {"n": [4, 5, 6, 7]}  # the whole free island, not 1-3 + 4
    p = placed(solve(c, MeshShape(tp=2, dp_shard=2)))
    assert p.gpus_by_node() == {"n": [4, 5, 6, 7]}  # leaves the 3-GPU island, no split pairs
    f = solve(c, MeshShape(tp=8), constraints=Constraints(tp_within="nvlink_domain"))
    assert f.reason == FailureReason.TP_DOMAIN_TOO_SMALL  # type: ignore[union-attr]


def test_avoid_nodes() -> None:
    c = cluster([("node-a", nvswitch(), {"leaf": "l0"}, []),
                 ("node-b", nvswitch(), {"leaf": "l0"}, [0, 1, 2, 3])])
    p = placed(solve(c, MeshShape(tp=4), constraints=Constraints(avoid_nodes=("node-b",))))
    assert p.nodes == ("node-a",)
    f = solve(c, MeshShape(tp=8), constraints=Constraints(avoid_nodes=("node-a",)))
    assert f.reason == FailureReason.INSUFFICIENT_FREE  # type: ignore[union-attr]
    by_id = ClusterTopology(levels=("leaf",), nodes=(
        ClusterNode("node-a", nvswitch(), {"leaf": "l0"}, node_id="ray-a"),
        ClusterNode("node-b", nvswitch(), {"leaf": "l0"}, node_id="ray-b")))
    p = placed(solve(by_id, MeshShape(tp=8), constraints=Constraints(avoid_nodes=("ray-a",))))
    assert p.nodes == ("node-b",) and p.ranks[0].node_key == "ray-b"


def test_multi_node_nvlink_domain() -> None:
    nodes = [(f"tray{i}", nvswitch(4), {"nvlink_domain": "nvl0", "leaf": "l0"}, [])
             for i in range(4)]
    c = cluster(nodes, levels=("nvlink_domain", "leaf"))
    p = placed(solve(c, MeshShape(tp=8, dp_replicate=2)))
    assert len(p.nodes) == 4 and not p.relaxed
    assert all(len({n for n, _ in g}) == 2 for g in tp_sets(p))  # TP spans two trays
    tp = {d.dimension: d for d in p.estimate.dimensions}["tp"]
    assert tp.bottleneck_gbs == 450.0 and tp.bottleneck in ("NV18", "NVL-domain")
    f = solve(c, MeshShape(tp=8), constraints=Constraints(tp_within="node"))
    assert f.reason == FailureReason.TP_DOMAIN_TOO_SMALL  # type: ignore[union-attr]


def test_stable_and_independent_of_node_listing_order() -> None:
    nodes = [(f"n{i}", nvswitch(), {"leaf": f"l{i % 2}"}, [i]) for i in range(4)]
    a = placed(solve(cluster(nodes), MeshShape(tp=2, dp_shard=6, pp=2)))
    b = placed(solve(cluster(list(reversed(nodes))), MeshShape(tp=2, dp_shard=6, pp=2)))
    assert a.as_dict() == b.as_dict()


def test_ranks_for_actors_follows_where_actors_landed() -> None:
    nodes = (ClusterNode("node-a", nvswitch(4), {"leaf": "l0"}, node_id="id-a"),
             ClusterNode("node-b", nvswitch(4), {"leaf": "l0"}, node_id="id-b"))
    c = ClusterTopology(levels=("leaf",), nodes=nodes)
    p = placed(solve(c, MeshShape(tp=4, dp_replicate=2)))
    assert p.ranks[0].node_key == "id-a"
    # Ray handed the bundles back in another order: ranks follow the GPUs, not the order.
    actors = [("id-b", 2), ("id-a", 0), ("id-b", 0), ("id-a", 3), ("id-a", 1), ("id-b", 1),
              ("id-b", 3), ("id-a", 2)]
    ranks = ranks_for_actors(c, p.mesh, actors, planned=p.ranks)
    assert ranks == (6, 0, 4, 3, 1, 5, 7, 2)
    # the actors landed on other GPUs than planned: the same rules on what they got
    got = [("node-a", 0), ("node-a", 1), ("node-b", 3), ("node-b", 2)]
    partial = ClusterTopology(levels=("leaf",), nodes=nodes)
    assert ranks_for_actors(partial, MeshShape(tp=2, dp_replicate=2), got) == (0, 1, 3, 2)
    with pytest.raises(ValueError, match="does not know"):
        ranks_for_actors(c, MeshShape(tp=2), [("id-x", 0), ("id-a", 1)])
    with pytest.raises(ValueError, match="same GPU"):
        ranks_for_actors(c, MeshShape(tp=2), [("id-a", 0), ("node-a", 0)])


def test_assign_ranks_is_row_major_pp_dpr_dps_tp() -> None:
    c = cluster([("n", nvswitch(), {}, [])], levels=())
    mesh = MeshShape(pp=2, dp_replicate=1, dp_shard=2, tp=2)
    ranks = assign_ranks(c, mesh, {"n": list(range(8))})
    assert [dict(r.coords) for r in ranks][5] == {"pp": 1, "dp_replicate": 0, "dp_shard": 0,
                                                  "ep": 0, "cp": 0, "tp": 1}
    assert [r.gpu for r in ranks] == list(range(8))


def test_docstring_examples_bestfit() -> None:
    # solver.py: the tightest node takes the job, the whole nodes stay whole
    c = cluster([("node-a", nvswitch(), {"leaf": "l0"}, []),
                 ("node-b", nvswitch(), {"leaf": "l0"}, [4, 5, 6, 7]),
                 ("node-c", nvswitch(), {"leaf": "l0"}, [])])
    assert placed(solve(c, MeshShape(tp=4))).gpus_by_node() == {"node-b": [0, 1, 2, 3]}
    # domains.py: no node holds 5 TP groups of 2; the tighter leaf L1 does (c: 4, d: 1)
    c = cluster([("a", nvswitch(), {"leaf": "L0"}, []), ("b", nvswitch(), {"leaf": "L0"}, []),
                 ("c", nvswitch(), {"leaf": "L1"}, []),
                 ("d", nvswitch(), {"leaf": "L1"}, [2, 3, 4, 5, 6, 7])])
    p = placed(solve(c, MeshShape(tp=2, dp_shard=5)))
    assert p.level == "leaf" and p.domain == ("L1",)
    assert {n: len(g) for n, g in p.gpus_by_node().items()} == {"c": 8, "d": 2}


def test_blocks_keep_fsdp_groups_inside_nodes() -> None:
    # blocks.py example: plain BestFit would take 5 + 8 + 8 + 8 + 3 GPUs and split two FSDP
    # groups over nodes; blocks of 8 take whole nodes.
    # leaf l0 frees 5 + 8 + 8 + 8 + 3 = 32 GPUs, exactly the job: plain BestFit's pick.
    busy = {"n0": [5, 6, 7], "n4": [0, 1, 2, 3, 4]}
    nodes = [(f"n{i}", nvswitch(), {"leaf": "l0" if i < 5 else "l1"}, busy.get(f"n{i}", []))
             for i in range(7)]
    root = build_tree(cluster(nodes), Packing(tp=1, tp_within="nvlink_domain"))
    (dom, counts), = candidates(root, units=32, per_block=1, packing=Packing(1, "node"), limit=1)
    assert dom.path == ("l0",) and sorted(counts.values()) == [3, 5, 8, 8, 8]
    p = placed(solve(cluster(nodes), MeshShape(dp_shard=8, dp_replicate=4)))
    assert sorted(p.gpus_by_node()) == ["n1", "n2", "n3", "n5"]
    for group in p.mesh.groups("dp_shard"):
        assert len({p.ranks[r].node for r in group}) == 1
    dims = {d.dimension: d.bottleneck for d in p.estimate.dimensions}
    assert dims["dp_shard"] == "NV18"


def test_pcie_boxes_spread_when_the_network_beats_pcie() -> None:
    # On two PCIe boxes the NODE path between a box's GPU pairs (19 GB/s) is slower than
    # InfiniBand NDR (50 GB/s): one TP pair per box, the data-parallel pair on one rail.
    c = cluster([("a", pcie(), {"leaf": "l0"}, [0, 2, 4, 6]), ("b", pcie(), {"leaf": "l0"}, [1])])
    p = placed(solve(c, MeshShape(tp=2, dp_shard=2), constraints=Constraints(tp_within="node")))
    assert p.gpus_by_node() == {"a": [5, 7], "b": [5, 7]}
    for a, b in p.mesh.groups("dp_shard"):
        assert p.ranks[a].gpu == p.ranks[b].gpu and p.ranks[a].node != p.ranks[b].node
    # NVSwitch nodes never spread: the job stays in one node
    c = cluster([("a", nvswitch(), {"leaf": "l0"}, [0, 2, 4, 6]),
                 ("b", nvswitch(), {"leaf": "l0"}, [1])])
    assert placed(solve(c, MeshShape(tp=2, dp_shard=2))).nodes in (("a",), ("b",))
