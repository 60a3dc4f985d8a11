"""POST /v1/plans for a model that fits nowhere: a 422 problem that says what would fit."""

from __future__ import annotations

from tests.unit.planner.test_plans_api import env  # noqa: F401 - the fixture

TRILLION = {"n_layers": 128, "d_model": 25600, "n_heads": 160, "vocab_size": 128256,
            "seq_len": 4096, "params": 10**12}


def test_plans_route_errors_instead_of_zero_feasible(env) -> None:  # noqa: F811
    client, _, auth, _ = env
    r = client.post("/v1/plans", headers=auth, json={
        "model": TRILLION, "global_batch": 64, "gpus": 8, "solve_top": 0,
        "hardware": {"memory_gb": 80}})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    (issue,) = body["errors"]
    assert issue["loc"] == "gpus" and issue["type"] == "no_feasible_plan"
    assert "fits no layout of 8 GPUs" in issue["msg"] and "GPUs (" in issue["msg"]
    nf = body["no_fit"]
    assert nf["least_gb_per_gpu"] > 1000 and nf["gpus_needed"] >= 512
    assert nf["nearest"]["need_gb"] == nf["least_gb_per_gpu"]
    ok = client.post("/v1/plans", headers=auth, json={"model": "gpt2", "global_batch": 16})
    assert ok.status_code == 200 and ok.json()["result"]["no_fit"] is None
