"""Cheap requests stay cheap: validating any spec or plan request is bounded work.

Before the bounds, `model.d_ff: 100000001` with `tp: 2` cost 4.3 s of server CPU (a linear
divisor scan to build the error message), `micro_batch_size` and a plan's `global_batch` the
same, a declared node with 1,000 GPUs built a million-entry link table (10,000 GPUs: about
11 GiB), 2 KB of YAML `[[[[...` cost 0.8 s (the parser ran before the depth limit) and 1 MiB
of YAML `[1,1,1,...` 9 s. Work is counted in executed Python lines (tests/unit/security/
work.py): the budget below is a few milliseconds of CPU, and the counter stops a runaway call
at once. The raw-text checks and libyaml run at C speed, uncounted: that bodies refused for
their nesting or size never reach a parser is checked directly.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from api.errors import ApiError
from api.routes.plans import PlanBody, request_cluster
from orchestrator.admission import documents
from orchestrator.admission.documents import parse_document
from orchestrator.bounds import limits as lim
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


MiB = 1024 * 1024
BODY_BUDGET = 20_000  # a refused body: ~1 ms of Python
# Refused on the raw text, before any parser runs.
RAW_REFUSED = {
    "2 KB of [[[[ (was 0.8 s)": ("[" * 2000, True),
    "1 MiB of [[[[": ("[" * MiB, True),
    "nested flow mappings": ("a: " + "{a: " * 500, True),
    "1 MiB of - - - -": ("- " * (MiB // 2), True),
    "1,400 ever deeper block levels": ("".join(" " * i + "a:\n" for i in range(1400)), True),
    "1 MiB of keys (was 4.7 s)": ("".join(f"k{i}: {i}\n" for i in range(120_000))[:MiB], True),
    "1 MiB of [1,1,1,...] (was 9 s)": ("[" + ",".join(["1"] * 520_000) + "]", True),
    "1 MiB of anchors (was 2.7 s)": ("".join(f"a{i}: &x{i} 1\n" for i in range(70_000))[:MiB],
                                     True),
    "1 MiB of tabs": ("\t" * MiB, True),
    "JSON: 1 MiB of [[[[": ("[" * MiB, False),
    "JSON: 1 MiB of ]]]]": ("]" * MiB, False),
    "JSON: 1 MiB of numbers (was 0.4 s)": ("[" + ",".join(["1"] * 520_000) + "]", False),
    "JSON: 1 MiB of keys": ("{" + ",".join(f'"k{i}":{i}' for i in range(90_000)) + "}", False),
}
# Refused by the parser, within the budget.
PARSE_REFUSED = {
    "alias bomb": ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                      strict=True)), True),
    "4,000-digit integers": ("\n".join(f"k{i}: " + "9" * 4000 for i in range(260)), True),
    "a 1 MiB integer": ("a: " + "9" * (MiB - 4), True),
    "a base-60 integer": ("a: " + ":".join(["1"] * 120), True),
    "JSON: 4,000-digit integers": ("[" + ",".join(["9" * 4000] * 260) + "]", False),
}
# Accepted by the decoder (the spec may still refuse them), within the budget.
DECODED = {
    "1 MiB scalar": ("name: " + "x" * (MiB - 10), True),
    "1 MiB comment": ("name: x\n#" + "y" * (MiB - 20), True),
    "1 MiB of escapes": ('a: "' + "\\n" * (MiB // 2 - 4) + '"', True),
    "a 1 MiB base-60 number is a string": ("a: " + ":".join(["1"] * 300_000), True),
    "just under the YAML item cap": ("".join(f"k{i}: {i}\n" for i in range(4990)), True),
    "a flow list just under it": ("[" + ",".join(["1"] * 9990) + "]", True),
    "JSON just under its cap": ("[" + ",".join(["1"] * 24_990) + "]", False),
}


@pytest.mark.parametrize(("text", "yaml_body"), RAW_REFUSED.values(), ids=RAW_REFUSED.keys())
def test_bodies_too_deep_or_too_large_never_reach_a_parser(
        text: str, yaml_body: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a parser ran")

    monkeypatch.setattr(documents, "_Loader", tripwire, raising=False)
    monkeypatch.setattr(documents.json, "loads", tripwire)
    with pytest.raises(SpecValidationError) as err:
        lines_executed(lambda: parse_document(text, yaml_body=yaml_body), budget=BODY_BUDGET)
    assert err.value.issues[0].type in ("too_deep", "too_large"), err.value.issues


@pytest.mark.parametrize(("text", "yaml_body"), PARSE_REFUSED.values(),
                         ids=PARSE_REFUSED.keys())
def test_hostile_documents_are_refused_within_the_budget(text: str, yaml_body: bool) -> None:
    with pytest.raises(SpecValidationError):
        lines_executed(lambda: parse_document(text, yaml_body=yaml_body), budget=BODY_BUDGET)


@pytest.mark.parametrize(("text", "yaml_body"), DECODED.values(), ids=DECODED.keys())
def test_the_largest_documents_decode_within_the_budget(text: str, yaml_body: bool) -> None:
    work = lines_executed(lambda: parse_document(text, yaml_body=yaml_body), budget=BUDGET)
    assert work < BUDGET
