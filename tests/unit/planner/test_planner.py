"""Planner mechanics: memory arithmetic, enumeration, rejection reasons, ranking."""

from __future__ import annotations

import pytest

from orchestrator.planner.memory import (
    KNOWN_MODELS,
    MemoryConfig,
    ModelShape,
    in_flight,
    memory_per_gpu,
)
from orchestrator.planner.planner import (
    Hardware,
    PlanningError,
    PlanRequest,
    layout_for,
    plan,
)
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology

SMALL = ModelShape(name="small", n_layers=8, d_model=1024, n_heads=16, vocab_size=32000,
                   seq_len=1024)


def node_cluster(n_nodes: int = 1, gpus: int = 8, link: str = "NV18",
                 busy: dict[int, frozenset[int]] | None = None) -> ClusterTopology:
    busy = busy or {}
    return ClusterTopology(levels=("leaf",), nodes=tuple(
        ClusterNode(name=f"n{i}", topology=NodeTopology.uniform(gpus, link),
                    labels={"leaf": "l0"}, busy_gpus=busy.get(i, frozenset()))
        for i in range(n_nodes)))


@pytest.mark.parametrize(("zero", "params", "grads", "opt"), [
    (0, 2, 2, 12), (1, 2, 2, 12 / 8), (2, 2, 2 / 8, 12 / 8), (3, 2 / 8, 2 / 8, 12 / 8)])
def test_zero_stages_shard_what_the_paper_says(zero: int, params: float, grads: float,
                                               opt: float) -> None:
    m = ModelShape(name="p", n_layers=1, d_model=8, n_heads=1, vocab_size=8, seq_len=8,
                   params=1_000_000_000)
    b = memory_per_gpu(m, MemoryConfig(dp_shard=8, zero_stage=zero))
    assert b.params == pytest.approx(params * 1e9, rel=1e-9)
    assert b.grads == pytest.approx(grads * 1e9, rel=1e-9)
    assert b.optimizer == pytest.approx(opt * 1e9, rel=1e-9)


def test_pipeline_in_flight_microbatches() -> None:
    assert in_flight(MemoryConfig(pp=4, microbatches=16)) == 4  # 1F1B: min(m, p)
    assert in_flight(MemoryConfig(pp=4, microbatches=16, schedule="gpipe")) == 16
    assert in_flight(MemoryConfig(pp=4, microbatches=2)) == 2
    one = memory_per_gpu(SMALL, MemoryConfig(pp=4, microbatches=16)).activations
    gpipe = memory_per_gpu(SMALL, MemoryConfig(pp=4, microbatches=16, schedule="gpipe"))
    assert gpipe.activations > 3 * one


def test_activation_checkpointing_and_tp_shrink_activations() -> None:
    m = ModelShape(name="m", n_layers=8, d_model=1024, n_heads=16, vocab_size=256, seq_len=1024)
    full = memory_per_gpu(m, MemoryConfig(micro_batch=4)).activations
    ac = memory_per_gpu(m, MemoryConfig(micro_batch=4, activation_checkpointing=True))
    sp = memory_per_gpu(m, MemoryConfig(micro_batch=4, tp=4, sequence_parallel=True))
    assert ac.activations < full / 3
    assert sp.activations < full / 3


def test_derived_parameter_count_matches_gpt_layout() -> None:
    m = KNOWN_MODELS["gpt2"]
    # blocks 12 * (4 h^2 + 8 h^2 + 4h), token + position embedding, untied head + final norm
    h, v = 768, 50257
    assert m.total_params == 12 * (12 * h * h + 4 * h) + v * h + 1024 * h + v * h + 2 * h


def test_plan_fields_and_bubble_formula() -> None:
    res = plan(node_cluster(2), PlanRequest(model=SMALL, global_batch=64, top_k=10_000))
    assert res.world_size == 16 and res.feasible == len(res.plans) > 10
    for p in res.plans:
        c = p.config
        assert c.tp * c.pp * c.dp == 16
        if c.pp > 1:
            v = c.virtual_stages
            assert p.bubble == pytest.approx((c.pp - 1) / (v * c.microbatches + c.pp - 1))
            assert p.step_s == pytest.approx(p.compute_s / (1 - p.bubble) + p.comm_exposed_s)
        else:
            assert p.bubble == 0
        assert p.comm_exposed_s <= p.comm_total_s + 1e-15
        assert p.memory.total <= Hardware().usable_bytes
    steps = [p.step_s for p in res.plans]
    assert steps[0] == min(steps)


def test_compute_time_is_six_n_tokens_over_flops() -> None:
    hw = Hardware(peak_tflops=100, efficiency=0.5)
    res = plan(node_cluster(1), PlanRequest(model=SMALL, global_batch=64, hardware=hw,
                                            top_k=10_000))
    tokens = 64 * SMALL.seq_len
    for p in res.plans[:20]:
        factor = 8 if p.config.activation_checkpointing else 6
        assert p.compute_s == pytest.approx(factor * SMALL.total_params * tokens / (8 * 50e12))


def test_memory_rejections_name_the_sizes() -> None:
    hw = Hardware(memory_gb=16)
    res = plan(node_cluster(1), PlanRequest(model=KNOWN_MODELS["llama-70b"], global_batch=8,
                                            hardware=hw))
    assert res.plans == ()
    assert res.rejected_counts["memory"] > 0
    assert any("does not fit in memory" in r.message and "GB" in r.message
               for r in res.rejected)


def test_heads_and_batch_rejections() -> None:
    odd = ModelShape(name="odd", n_layers=4, d_model=768, n_heads=12, vocab_size=1000,
                     seq_len=128)
    res = plan(node_cluster(1), PlanRequest(model=odd, global_batch=6))
    reasons = {r.reason for r in res.rejected}
    assert "heads" in reasons  # tp=8 does not divide 12 heads
    assert "batch" in reasons  # 6 sequences over dp=8 / dp=4
    assert all(p.config.tp in (1, 2, 4) for p in res.plans)


def test_even_stages_rejects_uneven_pipelines() -> None:
    m = ModelShape(name="m", n_layers=6, d_model=256, n_heads=8, vocab_size=1000, seq_len=64)
    res = plan(node_cluster(1), PlanRequest(model=m, global_batch=64, even_stages=True,
                                            top_k=10_000))
    assert all(6 % (p.config.pp * p.config.virtual_stages) == 0 for p in res.plans)
    assert res.rejected_counts.get("layers", 0) > 0


def test_only_free_gpus_count_and_too_many_is_an_error() -> None:
    cluster = node_cluster(2, busy={0: frozenset(range(4))})
    layout = layout_for(cluster, gpus=None)
    assert len(layout.slots) == 12
    assert ("n0", 0) not in layout.slots
    with pytest.raises(PlanningError, match="12 free"):
        plan(cluster, PlanRequest(model=SMALL, global_batch=64, gpus=13))


def test_links_follow_the_packed_layout() -> None:
    res = plan(node_cluster(2), PlanRequest(model=SMALL, global_batch=64, top_k=10_000))
    by = {p.config.label(): p for p in res.plans}
    # dp over 16 ranks crosses the two nodes; tp=8 stays on NVSwitch
    p = next(p for p in by.values() if p.config.tp == 8 and p.config.pp == 1)
    links = {d["dimension"]: d["link"] for d in p.comm}
    assert links["tp"] == "NV18"
    assert links.get("dp_shard", links.get("dp_replicate", "")).startswith("IB")


def test_solver_check_on_top_plans() -> None:
    res = plan(node_cluster(2), PlanRequest(model=SMALL, global_batch=64, solve_top=1))
    solved = res.plans[0].solver
    assert solved is not None and "total_s" in solved
    assert res.plans[1].solver is None
    # the planner's packed layout is what the solver picks on an empty cluster
    assert solved["total_s"] == pytest.approx(res.plans[0].comm_total_s, rel=0.05)
