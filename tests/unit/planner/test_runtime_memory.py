"""The memory model as the workers run it: deferred gradient sync under pipelining and
gradient accumulation, per-stage breakdowns, Llama 3's uneven end stages, a model that fits
nowhere (the error says what would fit), nearest-miss rejections."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from api.cli import app
from orchestrator.mesh import MeshShape
from orchestrator.placement.cost import ModelDims, communication_signature
from orchestrator.planner.memory import (
    KNOWN_MODELS,
    MemoryConfig,
    ModelShape,
    chunk_layers,
    memory_per_gpu,
    stage_memory,
)
from orchestrator.planner.planner import Hardware, PlanRequest, plan, virtual_options
from tests.unit.planner.test_planner import SMALL, node_cluster
from tests.unit.planner.test_validation import H100, dgx_cluster

ONE_B = ModelShape(name="p", n_layers=8, d_model=8, n_heads=1, vocab_size=8, seq_len=8,
                   params=1_000_000_000)
TRILLION = ModelShape(name="1t", n_layers=128, d_model=25600, n_heads=160, vocab_size=128256,
                      seq_len=4096, params=10**12)


def _n(cfg: MemoryConfig, stage: int = 0) -> float:
    from orchestrator.planner.memory import stage_params
    return stage_params(ONE_B, tp=cfg.tp, pp=cfg.pp, stage=stage, cfg=cfg)


@pytest.mark.parametrize("zero", [2, 3])
def test_pipelined_fsdp_holds_unsharded_grads_and_params(zero: int) -> None:
    cfg = MemoryConfig(pp=2, dp_shard=8, zero_stage=zero, microbatches=8)
    b = stage_memory(ONE_B, cfg, stage=0)
    n = _n(cfg)
    assert b.grads == pytest.approx(2 * n)  # bf16 gradients, all of the stage's
    assert b.params == pytest.approx(2 * n + (2 * n / 8 if zero == 3 else 0))
    assert b.optimizer == pytest.approx(12 * n / 8)


def test_gradient_accumulation_defers_sync_too() -> None:
    one = stage_memory(ONE_B, MemoryConfig(dp_shard=8, zero_stage=3, microbatches=1))
    acc = stage_memory(ONE_B, MemoryConfig(dp_shard=8, zero_stage=3, microbatches=4))
    assert acc.grads == pytest.approx(8 * one.grads)  # unsharded until the last microbatch
    assert acc.params == pytest.approx(one.params)  # pp = 1 re-shards after each backward


def test_fp32_counts_the_shard_next_to_the_full_copy() -> None:
    cfg = MemoryConfig(dp_shard=4, zero_stage=2, precision="fp32")
    n = _n(cfg)
    assert stage_memory(ONE_B, cfg).params == pytest.approx(4 * n * (1 + 1 / 4))


def test_stages_differ_and_the_busiest_is_reported() -> None:
    m = ModelShape(name="big-vocab", n_layers=8, d_model=1024, n_heads=16,
                   vocab_size=256_000, seq_len=4096)
    cfg = MemoryConfig(pp=4, microbatches=8, micro_batch=1)
    first, last = (stage_memory(m, cfg, stage=s) for s in (0, 3))
    assert first.params > stage_memory(m, cfg, stage=1).params  # the embedding
    assert last.activations > first.activations  # the logits of a 256K vocabulary
    assert memory_per_gpu(m, cfg) == last
    assert memory_per_gpu(SMALL, MemoryConfig()) == stage_memory(SMALL, MemoryConfig())


def test_reduce_scatter_once_per_step_with_accumulation() -> None:
    d = ModelDims(n_layers=8, grad_accum_steps=4, zero_stage=3)
    rows = {(r.dimension, r.primitive): r for r in
            communication_signature(MeshShape(dp_shard=4), d)}
    assert rows[("dp_shard", "reduce_scatter")].calls_per_step == 8
    assert rows[("dp_shard", "all_gather")].calls_per_step == 2 * 8 * 4


def test_llama3_layout_uneven_end_stages() -> None:
    assert chunk_layers(126, 128, ends_as_layers=True) == (0, *([1] * 126), 0)
    model = KNOWN_MODELS["llama-405b"]
    assert (8, True) in virtual_options(model, 16)  # 126 layers + embedding + head = 16 x 8
    assert (8, False) not in virtual_options(model, 16)
    cfg = MemoryConfig(pp=16, virtual_stages=8, ends_as_layers=True, tp=8, microbatches=16)
    assert stage_memory(model, cfg, stage=0).params < stage_memory(model, cfg, stage=1).params
    res = plan(dgx_cluster(2048), PlanRequest(model=model, global_batch=2048, hardware=H100,
                                              solve_top=0, top_k=10_000))
    ends = [p for p in res.plans if p.config.ends_as_layers]
    assert ends and any((p.config.tp, p.config.pp, p.config.virtual_stages) == (8, 16, 8)
                        for p in ends)
    assert "one layer fewer" in ends[0].notes[0]
    assert any("pp=32: interleaving with v=8" in n for n in res.notes)


def test_rejections_quote_the_nearest_misses() -> None:
    res = plan(node_cluster(1), PlanRequest(model=KNOWN_MODELS["llama-70b"], global_batch=8,
                                            hardware=Hardware(memory_gb=16), top_k=10_000))
    quoted = [r for r in res.rejected if r.reason == "memory"]
    assert len(quoted) == 3 and res.no_fit is not None
    assert quoted[0].need_bytes == res.no_fit.least_bytes
    assert all(q.need_bytes is not None and q.need_bytes <= res.no_fit.least_bytes * 1.5
               for q in quoted)


def test_a_model_that_fits_nowhere_says_what_would() -> None:
    res = plan(dgx_cluster(1), PlanRequest(model=TRILLION, global_batch=64, hardware=H100,
                                           solve_top=0))
    assert res.plans == () and res.feasible == 0
    nf = res.no_fit
    assert nf is not None and nf.least_bytes is not None and nf.gpus_needed is not None
    assert nf.least_bytes > 1000e9  # 1T x 16 bytes over 8 GPUs, at least
    assert nf.gpus_needed % 8 == 0 and nf.fit is not None
    ok = plan(dgx_cluster(nf.gpus_needed // 8), PlanRequest(
        model=TRILLION, global_batch=64, hardware=H100, solve_top=0))
    assert ok.plans and ok.plans[0].memory.total <= H100.usable_bytes
    short = plan(dgx_cluster(nf.gpus_needed // 8 - 1), PlanRequest(
        model=TRILLION, global_batch=64, hardware=H100, solve_top=0))
    assert short.plans == ()
    text = nf.message()
    assert f"{nf.least_bytes / 1e9:.1f} GB per GPU" in text and f"{nf.gpus_needed} GPUs" in text


def test_cli_plan_that_fits_nowhere_exits_2_with_a_json_error() -> None:
    args = ["plan", "--params", str(10**12), "--layers", "128", "--d-model", "25600",
            "--heads", "160", "--vocab", "128256", "--seq-len", "4096", "--gpus", "8",
            "--global-batch", "64", "--solve-top", "0"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 2
    err = json.loads(res.output)["error"]
    assert err["least_gb_per_gpu"] > 1000 and err["gpus_needed"] >= 512
    assert err["nearest"]["reason"] == "memory" and "GPUs" in err["message"]
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 2 and "fits no layout of 8 GPUs" in plain.output
