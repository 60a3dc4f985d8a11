"""`parallelism: auto` resolution and the ranked table (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.planner.autoplan import (
    format_table,
    request_from_spec,
    resolve_auto,
    resolved_data,
)
from orchestrator.planner.planner import PlanningError
from orchestrator.spec import SpecValidationError, parse_spec
from orchestrator.topology.model import ClusterNode, ClusterTopology, Gpu, NodeTopology


def cluster(nodes: int = 2, gpus: int = 8, memory_gb: float | None = None,
            busy: int = 0) -> ClusterTopology:
    def topo() -> NodeTopology:
        base = NodeTopology.uniform(gpus, "NV18")
        return NodeTopology(gpus=tuple(Gpu(index=g.index, memory_gb=memory_gb)
                                       for g in base.gpus), links=dict(base.links))
    return ClusterTopology(levels=("leaf",), nodes=tuple(
        ClusterNode(name=f"n{i}", topology=topo(), labels={"leaf": "l0"},
                    busy_gpus=frozenset(range(busy)) if i == 0 else frozenset())
        for i in range(nodes)))


BIG = {"name": "big", "parallelism": "auto",
       "model": {"n_layers": 32, "n_heads": 32, "d_model": 4096, "vocab_size": 32000,
                 "seq_len": 2048},
       "training": {"micro_batch_size": 4, "grad_accum_steps": 1}}


def test_auto_resolves_to_the_top_plan_and_keeps_the_global_batch() -> None:
    spec = parse_spec(BIG)
    assert spec.parallelism.auto
    resolved, result = resolve_auto(spec, cluster=cluster())
    assert result is not None
    top = result.plans[0].config
    p = resolved.parallelism
    assert not p.auto
    assert (p.tp, p.pp, p.dp_shard, p.dp_replicate) == (top.tp, top.pp, top.dp_shard,
                                                        top.dp_replicate)
    assert resolved.world_size == 16
    assert resolved.global_batch_size == 4 * 16  # micro_batch_size per planned GPU
    assert p.activation_checkpointing == top.activation_checkpointing


def test_auto_uses_free_gpus_and_reported_memory() -> None:
    c = cluster(memory_gb=40, busy=4)
    req = request_from_spec(parse_spec(BIG), cluster=c)
    assert req.gpus == 12 and req.hardware.memory_gb == 40
    resolved, _ = resolve_auto(parse_spec(BIG), cluster=c)
    assert resolved.world_size == 12


def test_auto_global_batch_and_gpus_are_honoured() -> None:
    data = dict(BIG, parallelism={"auto": True, "auto_gpus": 8, "auto_global_batch": 32})
    resolved, _ = resolve_auto(parse_spec(data), cluster=cluster())
    assert resolved.world_size == 8 and resolved.global_batch_size == 32


def test_spec_without_auto_is_untouched() -> None:
    spec = parse_spec({"name": "x"})
    assert resolve_auto(spec, cluster=cluster()) == (spec, None)


def test_auto_without_a_feasible_plan_says_why() -> None:
    with pytest.raises(PlanningError, match="no feasible plan.*memory"):
        resolve_auto(parse_spec(BIG), cluster=cluster(nodes=1, gpus=1, memory_gb=8))


def test_table_lists_plans_and_rejections() -> None:
    _, result = resolve_auto(parse_spec(BIG), cluster=cluster())
    assert result is not None
    text = format_table(result)
    assert "16 GPUs" in text and result.plans[0].config.label() in text
    assert text.splitlines()[2].lstrip().startswith("1 ")


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 12), heads=st.sampled_from([1, 2, 4, 8, 12, 16]),
       head_dim=st.sampled_from([16, 32]), seq=st.sampled_from([32, 64, 128]),
       mbs=st.sampled_from([1, 2, 3, 4, 8]), nodes=st.integers(1, 2),
       gpus=st.sampled_from([1, 2, 4, 8]))
def test_every_ranked_plan_resolves_to_a_valid_spec(layers: int, heads: int, head_dim: int,
                                                    seq: int, mbs: int, nodes: int,
                                                    gpus: int) -> None:
    data = {"name": "p", "parallelism": "auto", "training": {"micro_batch_size": mbs},
            "model": {"n_layers": layers, "n_heads": heads, "d_model": heads * head_dim,
                      "vocab_size": 512, "seq_len": seq}}
    spec = parse_spec(data)
    c = cluster(nodes=nodes, gpus=gpus)
    try:
        _, result = resolve_auto(spec, cluster=c)
    except PlanningError:
        return
    assert result is not None
    batch = mbs * nodes * gpus
    for p in result.plans:  # every alternative shown must be runnable as a spec, not just #1
        resolved = parse_spec(resolved_data(spec, p, global_batch=batch))
        assert resolved.world_size == nodes * gpus
        assert resolved.global_batch_size == batch
        par = resolved.parallelism
        assert layers % (par.pp * par.pp_virtual_stages) == 0
        # what workers/loop/parallelize.py and workers/loop/pipeline.py refuse never comes out
        if par.dp > 1 and par.effective_zero_stage() < 2:
            assert par.tp == 1
            assert not (par.effective_zero_stage() == 1 and par.pp > 1)


def test_spec_auto_forms_and_conflicts() -> None:
    assert parse_spec({"name": "a", "parallelism": "auto"}).parallelism.auto
    assert parse_spec({"name": "a", "parallelism": {"auto": True, "auto_gpus": 4}}
                      ).parallelism.auto_gpus == 4
    with pytest.raises(SpecValidationError, match="parallelism.auto"):
        parse_spec({"name": "a", "parallelism": {"auto": True, "tp": 2}})
    with pytest.raises(SpecValidationError):
        parse_spec({"name": "a", "parallelism": "manual"})

