"""The planner's expert- and context-parallel degrees: which it searches, how the memory model
shards experts and sequences, what `parallelism: auto` resolves MoE and long-sequence specs
to, and the note that explains the choice."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.mesh import MeshShape
from orchestrator.placement.cost import ModelDims, communication_signature
from orchestrator.planner.autoplan import resolve_auto
from orchestrator.planner.memory import MemoryConfig, ModelShape, activation_bytes, stage_memory
from orchestrator.planner.plan_space import CP_MIN_TOKENS, candidates
from orchestrator.planner.planner import PlanRequest, Rejection, plan
from orchestrator.spec import parse_spec
from tests.unit.planner.test_autoplan import cluster

TINY = Path(__file__).resolve().parents[3] / "examples" / "tiny"
MOE = ModelShape(name="moe", n_layers=4, d_model=256, n_heads=4, vocab_size=1000, seq_len=128,
                 experts=8)
MID_MOE = {"name": "moe", "parallelism": "auto", "resources": {"device": "cuda"},
           "model": {"n_layers": 16, "n_heads": 16, "d_model": 2048, "vocab_size": 32000,
                     "seq_len": 2048, "moe": {"experts": 8, "top_k": 2}},
           "training": {"micro_batch_size": 2, "grad_accum_steps": 1}}
LONG = {"name": "long", "parallelism": "auto", "resources": {"device": "cuda"},
        "model": {"n_layers": 32, "n_heads": 32, "d_model": 4096, "vocab_size": 32000,
                  "seq_len": 131072},
        "training": {"micro_batch_size": 1, "grad_accum_steps": 1}}


def _state_bytes(m: ModelShape, **cfg: int) -> float:
    mem = stage_memory(m, MemoryConfig(precision="fp32", **cfg))
    return mem.params + mem.grads + mem.optimizer


@pytest.mark.parametrize(("cfg", "divisor"), [
    ({}, 1),                                             # one rank holds everything
    ({"ep": 2}, 2),                                      # experts / 2, dense FSDP over 2
    ({"ep": 4}, 4),
    ({"ep": 2, "dp_shard": 2, "zero_stage": 3}, 4),      # experts / 2 / 2, dense over 4
    ({"ep": 4, "dp_shard": 2, "zero_stage": 3}, 8),
    ({"dp_shard": 4, "zero_stage": 3}, 4),               # no ep: FSDP shards experts too
])
def test_experts_are_sharded_by_ep_in_the_memory_model(cfg: dict[str, int],
                                                        divisor: int) -> None:
    # fp32 ZeRO-3 / unsharded experts: 16 bytes per parameter, spread over `divisor` ranks
    assert _state_bytes(MOE, **cfg) == pytest.approx(16 * MOE.total_params / divisor,
                                                     rel=1e-12)


def test_zero2_over_dp_shard_x_ep_shards_dense_and_expert_gradients_apart() -> None:
    # ZeRO-2 over dp_shard x ep: the dense gradients are sharded, the experts' are this rank's
    z2 = stage_memory(MOE, MemoryConfig(precision="fp32", ep=2, dp_shard=2, zero_stage=2))
    experts = MOE.n_layers * MOE.expert_params
    dense = MOE.total_params - experts
    assert z2.grads == pytest.approx(4 * (dense / 4 + experts / 2 / 2))
    assert z2.params == pytest.approx(4 * (dense + experts / 2) + 4 * (dense / 4 + experts / 4))


def test_cp_splits_the_activations_of_each_sequence() -> None:
    long = ModelShape(name="l", n_layers=4, d_model=512, n_heads=8, vocab_size=1000,
                      seq_len=8192)
    quarter = ModelShape(name="q", n_layers=4, d_model=512, n_heads=8, vocab_size=1000,
                         seq_len=2048)
    assert activation_bytes(long, MemoryConfig(cp=4, micro_batch=2)) == pytest.approx(
        activation_bytes(quarter, MemoryConfig(micro_batch=2)))


def _degrees(model: ModelShape, world: int, *, cp: bool = True) -> tuple[set[int], set[int],
                                                                        set[str]]:
    eps, cps, reasons = set(), set(), set()
    for c in candidates(model, world=world, global_batch=world * 4, max_tp=8,
                        context_parallel=cp):
        conf = c.config if isinstance(c, Rejection) else c
        if isinstance(c, Rejection):
            reasons.add(c.reason)
        eps.add(conf.ep)
        cps.add(conf.cp)
    return eps, cps, reasons


@pytest.mark.parametrize(("model", "world", "cp", "eps", "cps", "reason"), [
    (MOE, 8, True, {1, 2, 4, 8}, {1}, None),                   # MoE: ep, never cp
    (MOE, 6, True, {1, 2, 3, 6}, {1}, "experts"),              # 3, 6 do not divide 8 experts
    (ModelShape(name="d", n_layers=4, d_model=256, n_heads=4, vocab_size=1000, seq_len=128),
     8, True, {1}, {1}, None),                                  # short sequence: no cp
    (ModelShape(name="l", n_layers=4, d_model=256, n_heads=4, vocab_size=1000,
                seq_len=4 * CP_MIN_TOKENS), 8, True, {1}, {1, 2, 4}, None),
    (ModelShape(name="l", n_layers=4, d_model=256, n_heads=4, vocab_size=1000,
                seq_len=4 * CP_MIN_TOKENS), 8, False, {1}, {1}, None),  # CPU: never cp
])
def test_searched_degrees(model: ModelShape, world: int, cp: bool, eps: set[int],
                          cps: set[int], reason: str | None) -> None:
    got_eps, got_cps, reasons = _degrees(model, world, cp=cp)
    assert (got_eps, got_cps) == (eps, cps)
    if reason:
        assert reason in reasons


@pytest.mark.parametrize(("base", "gpus"), [("ep", 2), ("ep-fsdp", 4)])
def test_auto_on_the_tiny_moe_examples_gives_a_runnable_spec(base: str, gpus: int) -> None:
    doc = yaml.safe_load((TINY / f"{base}.yaml").read_text())
    doc["parallelism"] = {"auto": True, "auto_gpus": gpus}
    resolved, result = resolve_auto(parse_spec(doc), cluster=cluster(1, 8))
    assert result is not None and resolved.world_size == gpus
    p, top = resolved.parallelism, result.plans[0].config
    assert (p.ep, p.dp_shard, p.dp_replicate, p.cp) == (top.ep, top.dp_shard, top.dp_replicate, 1)
    assert 4 % p.ep == 0 and resolved.resources.device.value == "cpu"
    note = next(n for n in result.notes if n.startswith(f"ep={p.ep} "))
    # every other ep the planner tried is named with its best step time
    for ep in (e for e in (1, 2, 4) if e <= gpus and e != p.ep):
        assert f"ep={ep} " in note


def test_auto_picks_expert_parallel_for_a_moe_model_that_needs_it_and_says_why() -> None:
    resolved, result = resolve_auto(parse_spec(MID_MOE), cluster=cluster(1, 8))
    assert result is not None
    p = resolved.parallelism
    assert p.ep > 1 and 8 % p.ep == 0 and p.ep * p.dp_shard == 8
    # the global batch is the planned one, split over the ranks that read distinct data
    assert resolved.global_batch_size == 2 * 8
    note = next(n for n in result.notes if n.startswith(f"ep={p.ep} (expert parallel) chosen"))
    assert "ep=1 " in note and "s/step at best (+" in note and "exposed" in note


def test_long_sequences_get_context_parallel_on_gpus_only() -> None:
    resolved, result = resolve_auto(parse_spec(LONG), cluster=cluster(1, 8))
    assert result is not None and resolved.parallelism.cp > 1
    assert resolved.model.seq_len % (2 * resolved.parallelism.cp) == 0
    assert any(n.startswith(f"cp={resolved.parallelism.cp} (context parallel) chosen")
               for n in result.notes)
    cpu, result = resolve_auto(parse_spec({**LONG, "resources": {"device": "cpu"}}),
                               cluster=cluster(1, 8))
    assert result is not None and cpu.parallelism.cp == 1
    assert all(p.config.cp == 1 for p in result.plans)
    assert any("cp (context parallel) not considered: the job does not run on GPUs" in n
               for n in result.notes)


def test_planner_request_refusing_cp_never_proposes_it() -> None:
    m = ModelShape(name="l", n_layers=8, d_model=1024, n_heads=16, vocab_size=32000,
                   seq_len=32768)
    on = plan(cluster(1, 8), PlanRequest(model=m, global_batch=8, top_k=10_000))
    off = plan(cluster(1, 8), PlanRequest(model=m, global_batch=8, top_k=10_000,
                                          cp_refused="the job runs on CPU"))
    assert any(p.config.cp > 1 for p in on.plans)
    assert all(p.config.cp == 1 for p in off.plans)


def test_fsdp_over_cp_ranks_is_costed_when_dp_shard_is_one() -> None:
    rows = {(r.dimension, r.primitive) for r in communication_signature(
        MeshShape(cp=4), ModelDims(seq_len=8192))}
    assert {("cp", "send_recv"), ("cp", "all_gather"), ("cp", "reduce_scatter")} <= rows


def test_moe_gradients_on_the_wire_count_the_local_experts() -> None:
    d = ModelDims(n_layers=2, d_model=64, ffn_dim=256, moe_experts=8)
    ddp = {r.dimension: r for r in communication_signature(MeshShape(dp_replicate=2), d)}
    # all 8 experts' gradients are all-reduced under DDP; under ep=4 a rank holds 2
    assert d.rank_block_params(1) - d.rank_block_params(4) == 6 * 2 * 64 * 256
    assert ddp["dp_replicate"].bytes_per_call == (2 * d.rank_block_params(1)
                                                  + 2 * 64 * 32000) * 4


def test_cli_plan_takes_experts_and_explains_ep() -> None:
    import json

    from typer.testing import CliRunner

    from api.cli.app import app

    args = ["plan", "--layers", "16", "--d-model", "2048", "--heads", "16", "--vocab", "32000",
            "--seq-len", "2048", "--gpus", "8", "--global-batch", "16", "--solve-top", "0"]
    res = CliRunner().invoke(app, [*args, "--experts", "8", "--top-k", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["result"]["plans"][0]["config"]["ep"] > 1
    assert "(expert parallel) chosen" in out["table"]
    lone = CliRunner().invoke(app, [*args, "--top-k", "2"])
    assert lone.exit_code == 2 and "give --experts too" in lone.output
