"""Invalid specs through the real server: each is a 422 problem naming the field and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import Server, Users

OK = {"name": "bad-spec"}

# (case id, body, expected loc, words the message must contain)
CASES: list[tuple[str, Any, str, tuple[str, ...]]] = [
    ("missing-name", {}, "name", ("required",)),
    ("empty-name", {"name": ""}, "name", ("at least 1",)),
    ("long-name", {"name": "x" * 201}, "name", ("at most 200",)),
    ("unknown-top-level", {**OK, "gpus": 4}, "gpus", ("unknown field", "gpus")),
    ("unknown-parallelism", {**OK, "parallelism": {"tq": 2}}, "parallelism.tq",
     ("unknown field", "tq")),
    ("negative-tp", {**OK, "parallelism": {"tp": -1}}, "parallelism.tp",
     ("greater than or equal to 1",)),
    ("zero-dp-shard", {**OK, "parallelism": {"dp_shard": 0}}, "parallelism.dp_shard",
     ("greater than or equal to 1",)),
    ("tp-vs-heads", {**OK, "parallelism": {"tp": 3}}, "parallelism.tp",
     ("tp=3", "n_heads=4")),
    ("pp-vs-layers", {**OK, "parallelism": {"pp": 3, "pp_microbatches": 4},
                      "training": {"micro_batch_size": 8}},
     "parallelism.pp", ("n_layers=4",)),
    ("heads-vs-dmodel", {**OK, "model": {"d_model": 100, "n_heads": 3}}, "model.d_model",
     ("d_model=100", "n_heads=3")),
    ("workers-mismatch", {**OK, "resources": {"workers": 3},
                          "parallelism": {"dp_replicate": 2}},
     "resources.workers", ("workers=3", "set workers to 2")),
    ("microbatches-vs-batch", {**OK, "parallelism": {"pp": 2, "pp_microbatches": 3},
                               "training": {"micro_batch_size": 8}},
     "parallelism.pp_microbatches", ("pp_microbatches=3", "micro_batch_size=8")),
    ("zero3-without-shard", {**OK, "parallelism": {"zero_stage": 3}},
     "parallelism.zero_stage", ("dp_shard",)),
    ("comm-hook-with-fsdp", {**OK, "parallelism": {"dp_shard": 2},
                             "training": {"ddp": {"comm_hook": "fp16"}}},
     "training.ddp.comm_hook", ("comm_hook: none",)),
    ("negative-lr", {**OK, "training": {"lr": -0.1}}, "training.lr", ("greater than 0",)),
    ("bad-device", {**OK, "resources": {"device": "tpu"}}, "resources.device",
     ("auto", "cuda", "cpu")),
    ("bad-import-path", {**OK, "model": {"kind": "import", "path": "not a path"}},
     "model.path", ("pattern",)),
    ("timeouts-order", {**OK, "fault_tolerance": {"init_timeout_s": 10,
                                                  "collective_timeout_s": 60}},
     "fault_tolerance.init_timeout_s", ("collective_timeout_s",)),
    ("future-version", {**OK, "version": 2}, "version", ("1",)),
    ("priority-range", {**OK, "priority": 5000}, "priority", ("1000",)),
    ("fault-injection-disabled", {**OK, "inject_fault": {"kind": "hang", "rank": 0}},
     "inject_fault", ("disabled", "--allow-fault-injection")),
    ("not-a-mapping", ["name", "x"], "<root>", ("mapping",)),
    ("wrapper-extra-key", {"spec": OK, "submission_id": "k", "priority": 1}, "priority",
     ("unknown field",)),
    ("wrapper-bad-spec", {"spec": {"name": "w", "parallelism": {"tp": 0}}},
     "parallelism.tp", ("greater than or equal to 1",)),
]


@pytest.mark.parametrize(("body", "loc", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_invalid_spec_is_422_naming_field_and_problem(server: Server, users: Users, body: Any,
                                                      loc: str, words: tuple[str, ...]) -> None:
    with server.client(users.alice) as alice:
        r = alice.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    matching = [e for e in problem["errors"] if e["loc"] == loc]
    assert matching, f"no error at {loc!r}: {problem['errors']}"
    assert any(all(w in e["msg"] for w in words) for e in matching), matching
    assert loc in problem["detail"]


def test_invalid_specs_create_no_jobs(server: Server, users: Users) -> None:
    with server.client(users.alice) as alice:
        names = {j["name"] for j in alice.get("/v1/jobs", params={"limit": 500})
                 .json()["items"]}
    assert "bad-spec" not in names
