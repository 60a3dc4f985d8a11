"""Cost model: link figures, communication signature, alpha-beta times, purity."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.mesh import MeshShape
from orchestrator.placement.cost import (
    ModelDims,
    call_seconds,
    communication_signature,
    estimate,
    estimate_slots,
)
from orchestrator.placement.links import (
    Link,
    LinkFigures,
    LinkModel,
    best_ring_link,
    intra_node_link,
)
from orchestrator.placement.solver import Placement, solve
from orchestrator.spec import parse_spec
from tests.unit.placement.clusters import cluster, dgx1, nvswitch

F = LinkFigures()


def test_default_link_figures() -> None:
    assert intra_node_link("NV18", F).gbs == 450.0  # NVLink4
    assert intra_node_link("NV12", F).gbs == 300.0  # NVLink3
    assert intra_node_link("NV2", F).gbs == 50.0 and intra_node_link("NV1", F).gbs == 25.0
    assert intra_node_link("PIX", F).gbs == 32.0  # PCIe4 x16
    assert intra_node_link("PIX", LinkFigures(pcie_gen=5)).gbs == 64.0
    assert intra_node_link("PIX", F).gbs > intra_node_link("PXB", F).gbs \
        > intra_node_link("SYS", F).gbs == intra_node_link("SOC", F).gbs
    c = cluster([("a", nvswitch(), {"leaf": "l0", "spine": "s0"}, []),
                 ("b", nvswitch(), {"leaf": "l0", "spine": "s0"}, []),
                 ("c", nvswitch(), {"leaf": "l1", "spine": "s0"}, [])], levels=("leaf", "spine"))
    links = LinkModel(c)
    leaf = links.group_link([("a", 0), ("b", 0)])
    assert leaf is not None and (leaf.kind, leaf.gbs) == ("IB@leaf", 50.0)  # IB NDR
    assert leaf.alpha_s == pytest.approx(5e-6)
    assert links.group_link([("a", 0), ("c", 0)]).kind == "IB@spine"  # type: ignore[union-attr]
    assert links.group_link([("a", 0), ("c", 0)]).gbs == 25.0  # type: ignore[union-attr]
    off_rail = links.group_link([("a", 0), ("b", 1)])
    assert off_rail is not None and off_rail.gbs == 40.0 and off_rail.kind.endswith("cross-rail")
    hdr = LinkModel(c, LinkFigures(network="hdr", upper_level_factor=1.0))
    assert hdr.group_link([("a", 0), ("c", 0)]).gbs == 25.0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="ndr"):
        LinkFigures(network="eth")


def test_best_ring_follows_nvlinks_not_rank_order() -> None:
    topo = dgx1()
    assert topo.link(0, 5) == "SYS"
    ring = best_ring_link(topo, [0, 1, 4, 5], F)  # ring 0-1-5-4-0 is all NVLink
    assert ring is not None and ring.kind == "NV1"
    ring = best_ring_link(topo, [0, 1, 2, 5], F)  # 5 has only SYS links to 0 and 2
    assert ring is not None and ring.kind == "SYS"
    assert best_ring_link(topo, [3], F) is None


def test_call_seconds_alpha_beta() -> None:
    link = Link("x", 100.0, 1e-6)
    m = 1_000_000_000
    assert call_seconds("all_reduce", n=4, nbytes=m, link=link) == pytest.approx(
        2 * 3 / 4 * 0.01 + 6e-6)
    assert call_seconds("all_gather", n=4, nbytes=m, link=link) == pytest.approx(
        3 / 4 * 0.01 + 3e-6)
    assert call_seconds("reduce_scatter", n=4, nbytes=m, link=link) == pytest.approx(
        3 / 4 * 0.01 + 3e-6)
    assert call_seconds("send_recv", n=2, nbytes=m, link=link) == pytest.approx(0.01 + 1e-6)
    assert call_seconds("all_reduce", n=1, nbytes=m, link=link) == 0.0


def test_signature_rows() -> None:
    d = ModelDims(n_layers=8, d_model=1024, ffn_dim=4096, vocab_size=1000, seq_len=512,
                  micro_batch_size=4, pp_microbatches=2, ddp_bucket_mb=1.0)
    rows = communication_signature(MeshShape(pp=2, dp_replicate=2, dp_shard=2, tp=2), d)
    by = {(r.dimension, r.primitive): r for r in rows}
    assert [r.dimension for r in rows] == ["tp", "dp_shard", "dp_shard", "dp_replicate", "pp"]
    act = 2 * 512 * 1024 * 2  # 2 sequences per microbatch, bf16
    tp = by[("tp", "all_reduce")]
    assert (tp.participants, tp.bytes_per_call, tp.calls_per_step) == (2, act, 4 * 4 * 2)
    stage = (4 * d.block_params + 2 * 1000 * 1024 // 2) // 2
    ag = by[("dp_shard", "all_gather")]
    assert ag.bytes_per_call == stage // 4 * 2 and ag.calls_per_step == 2 * 4  # ZeRO-3
    assert by[("dp_shard", "reduce_scatter")].calls_per_step == 4
    dpr = by[("dp_replicate", "all_reduce")]
    assert dpr.bytes_per_call == 1 << 20 and dpr.calls_per_step == -(-stage // 2 * 4 // (1 << 20))
    pp = by[("pp", "send_recv")]
    assert (pp.participants, pp.bytes_per_call, pp.calls_per_step) == (2, act, 4)
    sp = communication_signature(MeshShape(tp=4), ModelDims(sequence_parallel=True))
    assert [r.primitive for r in sp] == ["all_gather", "reduce_scatter"]
    assert communication_signature(MeshShape(), d) == []


def test_model_dims_from_spec() -> None:
    spec = parse_spec({"name": "x", "parallelism": {"tp": 2, "dp_shard": 2},
                       "model": {"n_layers": 4, "n_heads": 4, "d_model": 128}})
    d = ModelDims.from_spec(spec)
    assert (d.n_layers, d.d_model, d.ffn_dim, d.zero_stage) == (4, 128, 512, 3)
    assert d.micro_batch_size == spec.training.micro_batch_size


def test_estimate_prefers_good_links_and_reports_bottleneck() -> None:
    c = cluster([("a", nvswitch(), {"leaf": "l0"}, []), ("b", nvswitch(), {"leaf": "l0"}, [])])
    mesh = MeshShape(tp=8, dp_replicate=2)
    p = solve(c, mesh)
    assert isinstance(p, Placement)
    good = estimate(p, cluster=c)
    assert good == p.estimate
    # TP split across the nodes (ranks alternate nodes) is far slower
    bad_slots = [("a" if r % 2 == 0 else "b", r // 2) for r in range(16)]
    bad = estimate_slots(bad_slots, mesh=mesh, links=LinkModel(c))
    assert bad.total_s > 1.5 * good.total_s
    tp_s = {d.dimension: d.seconds for d in bad.dimensions}["tp"]
    assert tp_s > 5 * {d.dimension: d.seconds for d in good.dimensions}["tp"]
    assert {d.dimension: d.bottleneck for d in bad.dimensions}["tp"].startswith("IB")
    faster = estimate(p, cluster=c, figures=LinkFigures(ib_ndr_gbs=100.0))
    dims = {d.dimension: d.seconds for d in faster.dimensions}
    assert dims["dp_replicate"] < {d.dimension: d.seconds for d in good.dimensions}["dp_replicate"]
    assert good.exposed_s < good.total_s


def test_placement_modules_are_pure() -> None:
    code = ("import sys, orchestrator.placement.solver, orchestrator.placement.cost; "
            "bad = [m for m in ('torch', 'ray', 'fastapi', 'sqlalchemy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_module_docstring_example_tp8_on_one_h100_node() -> None:
    c = cluster([("h100", nvswitch(), {}, [])], levels=())
    p = solve(c, MeshShape(tp=8))
    assert isinstance(p, Placement)
    (tp,) = p.estimate.dimensions
    # 128 all-reduces of 32 MiB over 8 ranks at 450 GB/s: 2*7/8*M/B + 14 * 2 us each
    each = 2 * 7 / 8 * (4096 * 4096 * 2) / 450e9 + 14 * 2e-6
    assert tp.seconds == pytest.approx(128 * each) and tp.seconds == pytest.approx(0.0203, 1e-2)


def test_solve_spec_uses_the_jobs_degrees_constraints_and_model() -> None:
    from orchestrator.placement.solver import solve_spec

    spec = parse_spec({"name": "x", "parallelism": {"tp": 4, "dp_replicate": 2},
                       "placement": {"avoid_nodes": ["a"]},
                       "model": {"n_layers": 4, "n_heads": 4, "d_model": 128}})
    c = cluster([("a", nvswitch(), {}, []), ("b", nvswitch(), {}, []), ("c", nvswitch(), {}, [])],
                levels=())
    p = solve_spec(c, spec, avoid=("b",))
    assert isinstance(p, Placement) and p.nodes == ("c",)
    tp = {d.dimension: d for d in p.estimate.dimensions}["tp"]
    calls = 4 * 4  # 4 blocks, one microbatch: 2 forward + 2 backward all-reduces each
    act = spec.training.micro_batch_size * 64 * 128 * 2  # seq 64, d_model 128, bf16
    link = Link("NV18", 450.0, 2e-6)
    assert tp.seconds == pytest.approx(calls * call_seconds("all_reduce", n=4, nbytes=act,
                                                            link=link))
