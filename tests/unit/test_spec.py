"""JobSpec validation: every bad spec names its field and the fix."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from orchestrator.admission.documents import parse_spec_text
from orchestrator.spec import (
    JobSpec,
    SpecValidationError,
    check_fits_cluster,
    json_schema,
    parse_spec,
    spec_warnings,
)

ROOT = Path(__file__).resolve().parents[2]


def _issues(data: object) -> list[tuple[str, str]]:
    with pytest.raises(SpecValidationError) as info:
        parse_spec(data)
    return [(i.loc, i.msg) for i in info.value.issues]


INVALID = [
    # (spec, field path, fragment of the message)
    ({}, "name", "required"),
    ({"name": ""}, "name", "at least 1"),
    ({"name": "x", "parallelism": {"tp": 3}}, "parallelism.tp", "tp=3 does not divide model.n_heads=4"),
    ({"name": "x", "parallelism": {"tp": 0}}, "parallelism.tp", "greater than or equal to 1"),
    ({"name": "x", "parallelism": {"pp": -2}}, "parallelism.pp", "greater than or equal to 1"),
    ({"name": "x", "parallelism": {"pipeline": 2}}, "parallelism.pipeline", "unknown field"),
    ({"name": "x", "parallelism": {"pp": 3}}, "parallelism.pp", "does not divide model.n_layers=4"),
    ({"name": "x", "parallelism": {"pp": 2, "pp_microbatches": 3}},
     "parallelism.pp_microbatches", "does not divide training.micro_batch_size=8"),
    ({"name": "x", "resources": {"workers": 3}, "parallelism": {"dp_replicate": 2}},
     "resources.workers", "set workers to 2"),
    ({"name": "x", "model": {"kind": "gpt", "d_model": 100, "n_heads": 3}}, "model.d_model",
     "not divisible by n_heads=3"),
    ({"name": "x", "model": {"kind": "import", "path": "not a path"}}, "model.path",
     "pattern"),
    ({"name": "x", "model": {"kind": "resnet"}}, "model", "tag"),
    ({"name": "x", "training": {"steps": 0}}, "training.steps", "greater than or equal to 1"),
    ({"name": "x", "training": {"lr": -1}}, "training.lr", "greater than 0"),
    ({"name": "x", "training": {"micro_batch_size": "eight"}}, "training.micro_batch_size",
     "valid integer"),
    ({"name": "x", "parallelism": {"zero_stage": 3}}, "parallelism.zero_stage",
     "raise dp_shard"),
    ({"name": "x", "parallelism": {"dp_shard": 2}, "training": {"ddp": {"comm_hook": "powersgd"}}},
     "training.ddp.comm_hook", "pure DDP"),
    ({"name": "x", "parallelism": {"pp": 2, "dp_replicate": 2, "zero_stage": 1}},
     "parallelism.zero_stage", "runs without tp and pp only"),
    ({"name": "x", "parallelism": {"tp": 2, "dp_shard": 2, "zero_stage": 1}},
     "parallelism.zero_stage", "runs without tp and pp only"),
    ({"name": "x", "inject_fault": {"kind": "hang", "rank": 5}}, "inject_fault.rank",
     "rank 5 does not exist"),
    ({"name": "x", "inject_fault": {"kind": "explode", "rank": 0}}, "inject_fault.kind",
     "Input should be"),
    ({"name": "x", "parallelism": {"pp": 2, "pp_schedule": "interleaved_1f1b",
                                   "pp_microbatches": 2}},
     "parallelism.pp_virtual_stages", "needs pp_virtual_stages >= 2"),
    ({"name": "x", "fault_tolerance": {"init_timeout_s": 10, "collective_timeout_s": 60}},
     "fault_tolerance.init_timeout_s", "must be >="),
    ({"name": "x", "version": 2}, "version", "Input should be 1"),
    ({"name": "x", "data": {"kind": "text_file"}}, "data.path", "required"),
    ({"name": "x", "debug": {"nccl_debug": "LOUD"}}, "debug.nccl_debug", "Input should be"),
    ("just a string", "<root>", "must be a mapping"),
    ({"name": "x", "training": {"ddp": {"comm_hook": "topk", "topk_ratio": 0}}},
     "training.ddp.topk_ratio", "greater than or equal"),
    ({"name": "x", "parallelism": {"ep": 2}}, "parallelism.ep", "set model.moe"),
    ({"name": "x", "parallelism": {"ep": 3}, "model": {"moe": {"experts": 4}},
      "checkpoint": {"enabled": False}}, "parallelism.ep", "does not divide model.moe.experts"),
    ({"name": "x", "parallelism": {"ep": 2, "tp": 2}, "model": {"moe": {"experts": 4}},
      "checkpoint": {"enabled": False}}, "parallelism.ep", "with dp_shard (FSDP"),
    ({"name": "x", "model": {"moe": {"experts": 2, "top_k": 3}}}, "model.moe.top_k",
     "exceeds experts"),
    ({"name": "x", "parallelism": {"cp": 2}, "resources": {"device": "cpu"}},
     "parallelism.cp", "CUDA only"),
    ({"name": "x", "parallelism": {"cp": 2, "tp": 2}, "resources": {"device": "cuda"}},
     "parallelism.cp", "with dp_shard (FSDP)"),
    ({"name": "x", "parallelism": {"cp": 3}, "resources": {"device": "cuda"}},
     "parallelism.cp", "multiple of it"),
    ({"name": "x", "preemption": {"grace_s": 0}}, "preemption.grace_s",
     "greater than or equal to 1"),
    ({"name": "x", "preemption": {"grace_s": 1e9}}, "preemption.grace_s",
     "less than or equal to 3600"),
    ({"name": "x", "preemption": {"preemptible": "maybe"}}, "preemption.preemptible",
     "valid boolean"),
    ({"name": "x", "preemption": {"priority": 3}}, "preemption.priority", "unknown field"),
    ({"name": "x", "parallelism": {"ep": 2, "dp_replicate": 2}, "training": {"ddp": {
        "comm_hook": "int8"}}, "model": {"moe": {"experts": 4}}}, "training.ddp.comm_hook",
     "pure DDP"),
]


@pytest.mark.parametrize(("data", "loc", "fragment"), INVALID,
                         ids=[f"{i}-{row[1]}" for i, row in enumerate(INVALID)])
def test_invalid_spec_names_field_and_problem(data: object, loc: str, fragment: str) -> None:
    issues = _issues(data)
    assert any(i_loc == loc and fragment in msg for i_loc, msg in issues), issues


def test_at_least_fifteen_invalid_cases() -> None:
    assert len(INVALID) >= 15


def test_every_problem_reported_at_once() -> None:
    issues = _issues({"name": "x", "parallelism": {"tp": 3, "pp": 3}})
    locs = [loc for loc, _ in issues]
    assert "parallelism.tp" in locs and "parallelism.pp" in locs


def test_world_size_and_global_batch() -> None:
    spec = parse_spec({"name": "x", "parallelism": {"tp": 2, "pp": 2, "dp_shard": 2,
                                                    "dp_replicate": 3, "pp_microbatches": 2},
                       "model": {"n_heads": 4, "n_layers": 4},
                       "training": {"micro_batch_size": 4, "grad_accum_steps": 2}})
    assert spec.world_size == 24
    assert spec.global_batch_size == 4 * 2 * 6
    # Expert-parallel ranks read their own data; context-parallel ranks share a batch.
    ep = parse_spec({"name": "x", "parallelism": {"dp_shard": 2, "ep": 2},
                     "model": {"moe": {"experts": 4}}, "checkpoint": {"enabled": False}})
    assert ep.world_size == 4 and ep.global_batch_size == 8 * 4
    cp = parse_spec({"name": "x", "parallelism": {"dp_shard": 2, "cp": 2},
                     "resources": {"device": "cuda"}})
    assert cp.world_size == 4 and cp.global_batch_size == 8 * 2


def test_spec_is_frozen() -> None:
    spec = parse_spec({"name": "x"})
    with pytest.raises(ValueError):
        spec.name = "y"  # type: ignore[misc]


def test_direct_construction_also_cross_checks() -> None:
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        JobSpec.model_validate({"name": "x", "parallelism": {"tp": 3}})


def test_yaml_and_json_round_trip() -> None:
    spec = parse_spec_text("name: y\nparallelism: {dp_shard: 2}\n")
    again = parse_spec(spec.model_dump(mode="json"))
    assert again == spec


def test_bad_yaml_is_a_parse_error() -> None:
    with pytest.raises(SpecValidationError, match="invalid YAML"):
        parse_spec_text("name: [unclosed", content_type="application/yaml")


def test_tp_larger_than_any_node() -> None:
    spec = parse_spec({"name": "x", "resources": {"device": "cuda"},
                       "parallelism": {"tp": 8}, "model": {"n_heads": 8}})
    issues = check_fits_cluster(spec, max_gpus_per_node=4)
    assert issues and issues[0].loc == "parallelism.tp" and "largest node has 4" in issues[0].msg
    assert check_fits_cluster(spec, max_gpus_per_node=8) == []


def test_schema_describes_every_field() -> None:
    schema = json_schema()
    missing = []
    for name, model in schema["$defs"].items():
        for field, prop in model.get("properties", {}).items():
            if "description" not in prop:
                missing.append(f"{name}.{field}")
    for field, prop in schema["properties"].items():
        if "description" not in prop:
            missing.append(field)
    assert not missing, missing


EXAMPLE_SPECS = sorted(p for p in glob.glob(str(ROOT / "examples" / "**" / "*.yaml"), recursive=True)
                       if "/clusters/" not in p)  # cluster topology files are not job specs


def test_quickstart_and_strategy_examples_exist() -> None:
    names = {Path(p).name for p in EXAMPLE_SPECS}
    assert {"quickstart.yaml", "fsdp.yaml", "tp-fsdp-2d.yaml", "pp-dp.yaml",
            "h100-8gpu-node.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLE_SPECS)
def test_examples_are_valid(path: str) -> None:
    parse_spec_text(Path(path).read_text())


@pytest.mark.parametrize(("training", "loc"), [
    ({"optimizer": "adamw", "ddp": {"comm_hook": "topk"}}, "training.ddp.topk_start_iter"),
    ({"optimizer": "sgd", "ddp": {"comm_hook": "topk"}}, "training.ddp.topk_start_iter"),
    ({"optimizer": "sgd", "ddp": {"comm_hook": "topk", "topk_start_iter": 25}}, None),
    ({"optimizer": "adamw", "ddp": {"comm_hook": "int8"}}, None),
])
def test_spec_warnings_name_topk_without_a_warm_start(training: dict, loc: str | None) -> None:
    spec = parse_spec({"name": "x", "parallelism": {"dp_replicate": 2}, "training": training})
    assert [w.loc for w in spec_warnings(spec)] == ([loc] if loc else [])


def test_preemption_defaults_and_both_kinds_carry_it() -> None:
    spec = parse_spec({"name": "x"})
    assert spec.preemption.preemptible is True and spec.preemption.grace_s == 60.0
    user = parse_spec({"name": "u", "entrypoint": {"command": ["python", "train.py"]},
                       "preemption": {"grace_s": 5}})
    assert user.preemption.grace_s == 5.0
    assert parse_spec(user.model_dump(mode="json")).preemption.grace_s == 5.0
