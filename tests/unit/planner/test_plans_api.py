"""POST /v1/plans and `parallelism: auto` at submit, in-process on a real SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.server import prepare
from orchestrator.lifecycle import JobState, Reason
from orchestrator.planner.calibration.figures import save
from orchestrator.settings import Settings
from orchestrator.spec import parse_spec
from orchestrator.store.repo import Store
from orchestrator.topology.model import NodeTopology
from orchestrator.topology.serialize import node_topology_to_dict

AUTO_SPEC = {"name": "auto-job", "parallelism": "auto",
             "model": {"n_layers": 4, "n_heads": 8, "d_model": 256, "vocab_size": 1024,
                       "seq_len": 128},
             "training": {"micro_batch_size": 4, "steps": 2}, "checkpoint": {"enabled": False}}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Store, dict[str, str], Path]]:
    settings = Settings(data_dir=tmp_path / "data")
    prepared = prepare(settings)
    for i in range(2):
        prepared.store.upsert_node(name=f"dgx-{i}", node_id=f"id{i}", gpus=8, cpus=64,
                                   labels={"leaf": "l0"},
                                   topology=node_topology_to_dict(NodeTopology.uniform(8, "NV18")))
    app = create_app(settings, store=prepared.store)
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        yield client, prepared.store, {"Authorization": f"Bearer {prepared.admin_token}"}, \
            settings.data_dir
    prepared.store.close()


def test_plans_endpoint_ranks_on_the_live_cluster(env) -> None:
    client, _, auth, _ = env
    r = client.post("/v1/plans", json={"model": "gpt2", "global_batch": 64}, headers=auth)
    assert r.status_code == 200, r.text
    body = r.json()
    res = body["result"]
    assert res["world_size"] == 16 and res["tp_domain"] == 8
    top = res["plans"][0]
    assert (top["config"]["tp"], top["config"]["pp"]) == (1, 1)
    assert {"params_gb", "grads_gb", "optimizer_gb", "activations_gb"} <= set(top["memory"])
    assert top["label"] in body["table"]
    # the real solver placed the top plan on the live cluster and its estimate is reported
    assert top["solver"]["total_s"] > 0 and "solver check #1" in body["table"]


def test_plans_endpoint_what_if_cluster_and_errors(env) -> None:
    client, _, auth, _ = env
    doc = {"levels": ["leaf"], "defaults": {"gpus": 8, "intra_node": "pcie"},
           "nodes": [{"name": "box", "labels": {"leaf": "a"}}]}
    r = client.post("/v1/plans", headers=auth, json={
        "model": {"n_layers": 24, "d_model": 2048, "n_heads": 16, "vocab_size": 50257,
                  "seq_len": 2048}, "global_batch": 32, "cluster": doc,
        "hardware": {"memory_gb": 24}})
    assert r.status_code == 200, r.text
    assert r.json()["result"]["world_size"] == 8
    assert all(p["config"]["tp"] <= 2 for p in r.json()["result"]["plans"])
    bad = client.post("/v1/plans", json={"model": "nope", "global_batch": 8}, headers=auth)
    assert bad.status_code == 422 and "unknown model" in bad.text
    many = client.post("/v1/plans", json={"model": "gpt2", "global_batch": 8, "gpus": 99},
                       headers=auth)
    assert many.status_code == 422 and "16 free" in many.text


def test_a_placing_jobs_planned_gpus_are_not_free(env) -> None:
    # PLACING: the attempt and its plan exist, no rank has reported where it runs yet.
    client, store, auth, _ = env
    job, _ = store.submit_job(parse_spec({"name": "placing", "parallelism": {"dp_replicate": 8}}),
                              owner="admin")
    store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
    plan = {"device": "gpu", "summary": "", "solver": {}, "bundles": [
        {"rank": r, "node": "dgx-0", "node_id": "id0", "gpu": r, "coords": {},
         "resources": {"GPU": 1, "CPU": 1.0}} for r in range(8)]}
    store.start_attempt(job.id, placement=plan)
    r = client.post("/v1/plans", json={"model": "gpt2", "global_batch": 64}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["world_size"] == 8
    many = client.post("/v1/plans", json={"model": "gpt2", "global_batch": 8, "gpus": 16},
                       headers=auth)
    assert many.status_code == 422 and "8 free" in many.text


def test_auto_spec_resolves_at_submit_and_records_the_plan(env) -> None:
    client, store, auth, _ = env
    r = client.post("/v1/jobs", json=AUTO_SPEC, headers=auth)
    assert r.status_code == 201, r.text
    job = client.get(f"/v1/jobs/{r.json()['id']}", headers=auth).json()
    par = job["spec"]["parallelism"]
    assert par["auto"] is False
    assert par["tp"] * par["pp"] * par["dp_shard"] * par["dp_replicate"] == 16
    events = [e for e in store.list_events(job["id"]) if e.reason == "PLANNED"]
    assert len(events) == 1
    planned = events[0].data
    assert planned["plan"]["config"]["tp"] == par["tp"]
    assert "step s" in planned["table"]
    # a retry with the same key is the same job even after the cluster changed; another
    # auto spec under that key is refused
    key = {"Idempotency-Key": "auto-retry-1"}
    first = client.post("/v1/jobs", json=AUTO_SPEC, headers={**auth, **key})
    store.upsert_node(name="dgx-2", node_id="id2", gpus=8, cpus=64, labels={"leaf": "l0"},
                      topology=node_topology_to_dict(NodeTopology.uniform(8, "NV18")))
    again = client.post("/v1/jobs", json=AUTO_SPEC, headers={**auth, **key})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = client.post("/v1/jobs", json={**AUTO_SPEC, "name": "other"},
                        headers={**auth, **key})
    assert other.status_code == 422 and "submission_id" in other.text


def test_calibration_file_changes_the_estimates(env) -> None:
    client, _, auth, data_dir = env
    body = {"model": "gpt2", "global_batch": 64, "top_k": 1000}
    before = client.post("/v1/plans", json=body, headers=auth).json()["result"]["plans"]
    save(data_dir, {"version": 1, "links": {"nvlink": {"alpha_us": 50.0, "gbs": 1.0},
                                             "network": {"alpha_us": 80.0, "gbs": 0.5}}})
    after = client.post("/v1/plans", json=body, headers=auth).json()["result"]["plans"]
    key = {p["label"]: p["comm_total_s"] for p in before}
    slower = [p for p in after if p["comm_total_s"] > 0]
    assert slower and all(p["comm_total_s"] > key[p["label"]] * 10 for p in slower)


def test_dashboard_job_page_shows_the_plan(env) -> None:
    client, store, auth, _ = env
    job_id = client.post("/v1/jobs", json=AUTO_SPEC, headers=auth).json()["id"]
    plain = client.post("/v1/jobs", json={"name": "manual"}, headers=auth).json()["id"]
    token = auth["Authorization"].removeprefix("Bearer ")
    r = client.post("/login", content=f"token={token}", follow_redirects=False,
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 303, r.text
    label = next(e.data for e in store.list_events(job_id) if e.reason == "PLANNED")["plan"]
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert 'id="plan"' in page.text and label["label"] in page.text
    assert 'id="plan"' not in client.get(f"/jobs/{plain}").text


def test_moe_plans_search_expert_parallel_over_the_api(env) -> None:
    client, _, auth, _ = env
    moe = {"n_layers": 16, "d_model": 2048, "n_heads": 16, "vocab_size": 32000,
           "seq_len": 2048, "experts": 8, "top_k": 2}
    r = client.post("/v1/plans", json={"model": moe, "global_batch": 16, "gpus": 8},
                    headers=auth)
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    top = res["plans"][0]["config"]
    assert top["ep"] > 1 and 8 % top["ep"] == 0
    assert any(n.startswith(f"ep={top['ep']} (expert parallel) chosen") for n in res["notes"])
    for bad, msg in (({**moe, "experts": 1}, "not a mixture"), ({**moe, "top_k": 9}, "top_k")):
        r = client.post("/v1/plans", json={"model": bad, "global_batch": 16}, headers=auth)
        assert r.status_code == 422 and msg in r.text, r.text
    # `parallelism: auto` on a MoE spec resolves at submit, ep included
    spec = {**AUTO_SPEC, "name": "auto-moe", "model": {**AUTO_SPEC["model"],
                                                        "moe": {"experts": 4}}}
    sub = client.post("/v1/jobs", json=spec, headers=auth)
    assert sub.status_code == 201, sub.text
    par = client.get(f"/v1/jobs/{sub.json()['id']}", headers=auth).json()["spec"]["parallelism"]
    assert par["auto"] is False and 4 % par["ep"] == 0
    assert par["dp_shard"] * par["dp_replicate"] * par["ep"] == 16
