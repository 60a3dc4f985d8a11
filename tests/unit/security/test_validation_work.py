"""Cheap requests stay cheap: validating any spec or plan request is bounded work.

Before the bounds, `model.d_ff: 100000001` with `tp: 2` cost 4.3 s of server CPU (a linear
divisor scan to build the error message), `micro_batch_size` and a plan's `global_batch` the
same, and a declared node with 1,000 GPUs built a million-entry link table (10,000 GPUs: about
11 GiB). Work is counted in executed Python lines (tests/unit/security/work.py): the budget
below is a few milliseconds of CPU, and the counter stops a runaway call at once.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from api.errors import ApiError
from api.routes.plans import PlanBody, request_cluster
from orchestrator import limits as lim
from orchestrator.documents import parse_document
from orchestrator.spec import SpecValidationError, parse_spec
from tests.unit.security.work import lines_executed

# Executed Python lines. This machine runs ~30 million lines/s untraced, so a million lines
# is ~35 ms: the largest accepted plan request (4,096 nodes) takes ~0.6 M lines, ~20 ms.
BUDGET = 1_000_000
SPEC_BUDGET = 20_000  # a spec is small: ~1 ms


def _validate_spec(doc: dict[str, Any]) -> list[str]:
    try:
        parse_spec(doc)
    except SpecValidationError as exc:
        return [i.loc for i in exc.issues]
    return []


def _validate_plan(doc: dict[str, Any]) -> str:
    try:
        body = PlanBody.model_validate(doc)
        if body.cluster is not None:
            request_cluster(body.cluster)
    except (ApiError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        return type(exc).__name__
    return "ok"


HOSTILE_SPECS = {
    "d_ff 1e8+1 with tp 2 (was 4.3 s)": {"name": "x", "parallelism": {"tp": 2},
                                         "model": {"d_ff": 100_000_001}},
    "d_ff at its bound, tp 3": {"name": "x", "parallelism": {"tp": 3},
                                "model": {"n_heads": 3, "d_model": 96, "d_ff": lim.MAX_FFN}},
    "micro_batch 1e12 vs pp_microbatches": {"name": "x", "parallelism": {
        "pp": 2, "pp_microbatches": 7}, "training": {"micro_batch_size": 10**12}},
    "micro_batch at its bound vs pp_microbatches": {"name": "x", "model": {"n_layers": 2},
        "parallelism": {"pp": 2, "pp_microbatches": 17},
        "training": {"micro_batch_size": 720_720}},
    "dp_replicate 1e12": {"name": "x", "parallelism": {"dp_replicate": 10**12}},
    "every degree at its bound": {"name": "x", "parallelism": {
        "tp": lim.MAX_WORLD_SIZE, "pp": lim.MAX_WORLD_SIZE, "dp_shard": lim.MAX_WORLD_SIZE,
        "dp_replicate": lim.MAX_WORLD_SIZE}},
    "n_layers at its bound vs pp": {"name": "x", "model": {"n_layers": lim.MAX_LAYERS},
                                    "parallelism": {"pp": 7, "pp_microbatches": 7}},
}


@pytest.mark.parametrize("doc", HOSTILE_SPECS.values(), ids=HOSTILE_SPECS.keys())
def test_hostile_specs_are_refused_within_the_budget(doc: dict[str, Any]) -> None:
    locs: list[str] = []
    work = lines_executed(lambda: locs.extend(_validate_spec(doc)), budget=SPEC_BUDGET)
    assert locs, "expected a 422"
    assert work < SPEC_BUDGET


def test_the_largest_accepted_spec_validates_within_the_budget() -> None:
    doc = {"name": "n" * lim.MAX_NAME_CHARS, "parallelism": {"tp": 8, "pp": 8, "dp_shard": 32,
                                                             "dp_replicate": 32,
                                                             "pp_microbatches": 8},
           "model": {"n_layers": lim.MAX_LAYERS, "n_heads": 1024, "d_model": lim.MAX_HIDDEN,
                     "d_ff": lim.MAX_FFN, "vocab_size": lim.MAX_VOCAB,
                     "seq_len": lim.MAX_SEQ_LEN},
           "training": {"steps": lim.MAX_STEPS, "micro_batch_size": 16,
                        "grad_accum_steps": 64, "seed": lim.MAX_SEED},
           "placement": {"avoid_nodes": [f"node-{i}" for i in range(lim.MAX_CLUSTER_NODES)]}}
    locs: list[str] = []
    work = lines_executed(lambda: locs.extend(_validate_spec(doc)), budget=SPEC_BUDGET)
    assert locs == [] and work < SPEC_BUDGET


def _node(i: int, **kw: Any) -> dict[str, Any]:
    return {"name": f"n{i}", "labels": {"leaf": f"l{i // 32}"}, **kw}


HOSTILE_PLANS = {
    "global_batch 1e12": {"model": "llama-7b", "global_batch": 10**12, "gpus": 8},
    "gpus 1e9": {"model": "llama-7b", "global_batch": 8, "gpus": 10**9},
    "a node with 1,000 GPUs": {"model": "llama-7b", "global_batch": 8, "cluster": {
        "levels": ["leaf"], "nodes": [_node(0, gpus=1000)]}},
    "4,096 nodes of every shape": {"model": "llama-7b", "global_batch": 8, "cluster": {
        "levels": ["leaf"], "nodes": [_node(i, gpus=1 + i % lim.MAX_GPUS_PER_NODE,
                                            intra_node=f"NV{1 + i // 64}")
                                      for i in range(lim.MAX_CLUSTER_NODES)]}},
    "too many nodes": {"model": "llama-7b", "global_batch": 8, "cluster": {
        "levels": [], "nodes": [{"name": f"n{i}", "gpus": 1}
                                for i in range(lim.MAX_CLUSTER_NODES + 1)]}},
}


@pytest.mark.parametrize("doc", HOSTILE_PLANS.values(), ids=HOSTILE_PLANS.keys())
def test_hostile_plan_requests_are_refused_within_the_budget(doc: dict[str, Any]) -> None:
    outcome: list[str] = []
    tracemalloc.start()
    try:
        work = lines_executed(lambda: outcome.append(_validate_plan(doc)), budget=BUDGET)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert outcome != ["ok"] and work < BUDGET
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"


def test_a_large_realistic_cluster_validates_within_the_budget() -> None:
    # 4,096 DGX nodes behind leaves and spines: one generated shape, shared by every node.
    doc = {"model": "llama-405b", "global_batch": 2048, "cluster": {
        "levels": ["leaf", "spine"], "defaults": {"gpus": 8, "intra_node": "nvswitch"},
        "nodes": [{"name": f"dgx-{i:05d}", "labels": {"leaf": f"leaf-{i // 32}",
                                                     "spine": f"spine-{i // 512}"}}
                  for i in range(lim.MAX_CLUSTER_NODES)]}}
    outcome: list[str] = []
    work = lines_executed(lambda: outcome.append(_validate_plan(doc)), budget=BUDGET)
    assert outcome == ["ok"] and work < BUDGET


def test_documents_with_many_numbers_decode_within_the_budget() -> None:
    text = '{"name": "x", "model": {"kind": "import", "path": "m:f", "kwargs": {"v": [' + \
        ", ".join(["1234567890123456789"] * 20_000) + "]}}}"
    work = lines_executed(lambda: parse_document(text, yaml_body=False), budget=BUDGET)
    assert work < BUDGET
