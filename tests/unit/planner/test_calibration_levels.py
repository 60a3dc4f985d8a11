"""Calibration per topology level: which probes a cluster gets, the per-level fits, and the
cost model reproducing each measured level from the stored figures."""

from __future__ import annotations

import pytest

from orchestrator.placement.links import LinkModel, intra_node_link
from orchestrator.planner.calibration.figures import figures_from
from orchestrator.planner.calibration.fit import counts
from orchestrator.planner.calibration.probes import ProbeError, intra_link, plan_probes
from orchestrator.planner.calibration.report import build_doc
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology


def _cluster(placement: dict[str, dict[str, str]], *, gpus: int = 8,
             levels: tuple[str, ...] = ("leaf", "spine")) -> ClusterTopology:
    return ClusterTopology(levels=levels, nodes=tuple(
        ClusterNode(name=n, topology=NodeTopology.uniform(gpus, "NV18") if gpus
                    else NodeTopology(gpus=()), labels=lab, node_id=f"id-{n}")
        for n, lab in placement.items()))


FOUR = {"a": {"leaf": "l0", "spine": "s0"}, "b": {"leaf": "l0", "spine": "s0"},
        "c": {"leaf": "l1", "spine": "s0"}, "d": {"leaf": "l2", "spine": "s1"}}
CPUS = {n: 16.0 for n in FOUR}


def test_one_probe_per_level_finest_first() -> None:
    probes = plan_probes(_cluster(FOUR), free_cpus=CPUS)
    got = [(p.level, p.span, p.nodes, p.gpu, p.link_class) for p in probes]
    assert got == [("node", 0, ("d",) * 8, True, None),
                   ("leaf", 1, ("a", "b"), True, "network"),
                   ("spine", 2, ("a", "c"), True, "network"),
                   ("cluster", 3, ("a", "d"), True, "network")]


def test_intra_node_probe_uses_only_free_gpus_and_cpu_slots() -> None:
    cl = _cluster(FOUR)
    busy = cl.with_busy({"a": range(5), "b": range(8), "c": range(8), "d": range(8)})
    probes = plan_probes(busy, free_cpus={**CPUS, "a": 1.0}, cpus_per_rank=0.25)
    assert probes[0].nodes == ("a",) * 3  # 3 free GPUs on a; b, c, d are full
    assert [p.level for p in probes] == ["node"]  # no second node with a free GPU
    assert plan_probes(cl, free_cpus=CPUS, max_ranks=4)[0].ranks == 4


def test_cpu_only_cluster_probes_cpu_ranks() -> None:
    cl = _cluster({"h": {}, "c1": {}}, gpus=0, levels=())
    probes = plan_probes(cl, free_cpus={"h": 1.0, "c1": 2.0})
    assert [(p.level, p.nodes, p.gpu) for p in probes] == [
        ("node", ("c1", "c1"), False), ("cluster", ("c1", "h"), False)]


def test_nothing_to_measure_is_a_clear_error() -> None:
    cl = _cluster({"only": {}}, gpus=1, levels=())
    with pytest.raises(ProbeError, match="no node has two free GPUs"):
        plan_probes(cl, free_cpus={"only": 4.0})


def test_nodes_of_one_nvlink_domain_are_probed_as_nvlink() -> None:
    cl = _cluster({"x": {"nvlink_domain": "rack1", "leaf": "l0"},
                   "y": {"nvlink_domain": "rack1", "leaf": "l0"},
                   "z": {"nvlink_domain": "rack2", "leaf": "l0"}}, gpus=4,
                  levels=("nvlink_domain", "leaf"))
    probes = plan_probes(cl, free_cpus={"x": 8.0, "y": 8.0, "z": 8.0})
    assert [(p.level, p.nodes, p.link_class) for p in probes] == [
        ("node", ("z",) * 4, None), ("nvlink_domain", ("x", "y"), "nvlink"),
        ("leaf", ("x", "z"), "network")]


def test_intra_link_reads_the_assigned_gpus() -> None:
    links = {(0, 1): "NV2", (0, 2): "PIX", (1, 2): "SYS"}
    from orchestrator.topology.model import Gpu
    cl = ClusterTopology(levels=(), nodes=(ClusterNode(
        name="dgx", topology=NodeTopology(gpus=tuple(Gpu(index=i) for i in range(3)),
                                          links=links)),))
    assert intra_link(cl, "dgx", [0, 1]) == ("nvlink", "NV2")
    assert intra_link(cl, "dgx", [0, 2]) == ("pcie", "PIX")
    assert intra_link(cl, "dgx", [0, 1, 2]) == ("pcie", "SYS")  # the ring's bottleneck
    assert intra_link(cl, "dgx", []) == ("pcie", None)  # CPU ranks: the host path


def _rows(alpha_us: float, gbs: float, n: int) -> list[dict[str, float]]:
    out = []
    for prim in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        m = 2 if prim == "send_recv" else n
        a, b = counts(prim, m)
        for nbytes in (64, 4096, 1 << 20, 16 << 20):
            out.append({"primitive": prim, "n": m, "bytes": nbytes,
                        "seconds": a * alpha_us * 1e-6 + b * nbytes / (gbs * 1e9)})
    return out


def test_per_level_fits_and_the_cost_model_reproduces_every_level() -> None:
    measured = [
        {"level": "node", "span": 0, "link_class": "nvlink", "kind": "NV18",
         "nodes": ["d"] * 8, "rows": _rows(3.0, 400.0, 8)},
        {"level": "leaf", "span": 1, "link_class": "network", "nodes": ["a", "b"],
         "rows": _rows(8.0, 40.0, 2)},
        {"level": "spine", "span": 2, "link_class": "network", "nodes": ["a", "c"],
         "rows": _rows(11.0, 24.0, 2)},
        {"level": "cluster", "span": 3, "link_class": "network", "nodes": ["a", "d"],
         "rows": _rows(14.0, 14.4, 2)},
    ]
    doc = build_doc(measured, mode="ray", backend="nccl")
    assert set(doc["levels"]) == {"node", "leaf", "spine", "cluster"}
    assert doc["levels"]["spine"]["gbs"] == pytest.approx(24.0, rel=1e-6)
    assert doc["links"]["network"]["level"] == "leaf"  # the finest network level
    assert doc["links"]["nvlink"]["gbs"] == pytest.approx(400.0, rel=1e-6)
    up = doc["network_upper"]
    assert up["upper_level_factor"] == pytest.approx((14.4 / 40.0) ** 0.5, rel=1e-6)
    assert up["hop_alpha_us"] == pytest.approx(3.0, rel=1e-6)
    assert len(doc["rows"]) == 4 * 16 and {r["level"] for r in doc["rows"]} == set(
        doc["levels"])
    f = figures_from(doc)
    model = LinkModel(_cluster(FOUR), f)
    leaf = model.network_link(1, rail_aligned=True)
    top = model.network_link(3, rail_aligned=True)
    assert (leaf.gbs, leaf.alpha_s) == pytest.approx((40.0, 8e-6), rel=1e-6)
    assert (top.gbs, top.alpha_s) == pytest.approx((14.4, 14e-6), rel=1e-6)
    assert model.ring("d", range(8)).gbs == pytest.approx(400.0, rel=1e-6)


def test_a_finest_network_level_above_the_leaf_is_brought_down_to_leaf_figures() -> None:
    doc = build_doc([{"level": "spine", "span": 2, "link_class": "network",
                      "nodes": ["a", "c"], "rows": _rows(11.0, 24.0, 2)}],
                    mode="ray", backend="gloo")
    assert "network_upper" not in doc
    f = figures_from(doc)
    spine = LinkModel(_cluster(FOUR), f).network_link(2, rail_aligned=True)
    assert (spine.gbs, spine.alpha_s) == pytest.approx((24.0, 11e-6), rel=1e-6)


def test_a_pcie_ring_over_sys_is_stored_as_the_x16_figure() -> None:
    doc = build_doc([{"level": "node", "span": 0, "link_class": "pcie", "kind": "SYS",
                      "nodes": ["x"] * 2, "rows": _rows(5.0, 8.0, 2)}],
                    mode="ray", backend="nccl")
    f = figures_from(doc)
    assert intra_node_link("SYS", f).gbs == pytest.approx(8.0, rel=1e-6)
    assert f.pcie4_x16_gbs == pytest.approx(8.0 / 0.4, rel=1e-6)


def test_coarser_level_measuring_faster_is_capped() -> None:
    doc = build_doc([{"level": "leaf", "span": 1, "link_class": "network", "nodes": ["a", "b"],
                      "rows": _rows(8.0, 2.0, 2)},
                     {"level": "spine", "span": 2, "link_class": "network",
                      "nodes": ["a", "c"], "rows": _rows(6.0, 3.0, 2)}],
                    mode="ray", backend="gloo")
    up = doc["network_upper"]
    assert up["upper_level_factor"] == 1.0 and up["measured_factor"] == pytest.approx(1.5)
    assert up["hop_alpha_us"] == 0.0
