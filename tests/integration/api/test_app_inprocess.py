"""The app in-process (TestClient) on a real SQLite store: paths that need store state the
API itself never writes (telemetry, nodes), app wiring, and error mapping."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.admission import ClusterShape
from api.app import create_app
from api.server import prepare
from orchestrator.lifecycle import JobState, Reason
from orchestrator.settings import Settings
from orchestrator.store.repo import Store


class Recorder:
    """A runtime as the API sees it (api.state.RuntimeHooks), recording start and stop."""

    isolation = None

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.pokes = 0

    def poke(self) -> None:
        self.pokes += 1

    def code_refusal(self) -> str | None:
        return None

    def pool_status(self) -> None:
        return None

    async def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:  # sync on purpose: both kinds are accepted
        self.calls.append("stop")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Store, dict[str, str], Recorder]]:
    settings = Settings(data_dir=tmp_path / "data", allow_fault_injection=True)
    prepared = prepare(settings)
    runtime = Recorder()
    app = create_app(settings, store=prepared.store, runtime=runtime)
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        yield client, prepared.store, {"Authorization": f"Bearer {prepared.admin_token}"}, runtime
    prepared.store.close()


def test_runtime_hook_starts_and_stops_with_the_app(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d")
    prepared = prepare(settings)
    runtime = Recorder()
    with TestClient(create_app(settings, store=prepared.store, runtime=runtime),
                    base_url="http://127.0.0.1"):
        assert runtime.calls == ["start"]
    assert runtime.calls == ["start", "stop"]
    prepared.store.close()


def test_submit_and_cancel_wake_the_runtime_and_a_retry_does_not(env) -> None:
    client, _, auth, runtime = env
    body = {"spec": {"name": "wake", "parallelism": {"dp_replicate": 2}}, "submission_id": "w1"}
    job = client.post("/v1/jobs", json=body, headers=auth).json()
    assert runtime.pokes == 1
    assert client.post("/v1/jobs", json=body, headers=auth).status_code == 200
    assert runtime.pokes == 1  # the same submission again: nothing new to schedule
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth).status_code == 200
    assert runtime.pokes == 2


def test_telemetry_endpoints_return_what_the_control_plane_stored(env) -> None:
    client, store, auth, _ = env
    job = client.post("/v1/jobs", json={"name": "tele", "parallelism": {"dp_replicate": 2}},
                      headers=auth).json()
    store.transition(job["id"], JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
    attempt = store.start_attempt(job["id"], placement={"nodes": ["n0"]})
    store.upsert_ranks(job["id"], attempt.number, [
        {"rank": r, "node": "n0", "gpu": r, "coords": {"dp_replicate": r}, "state": "RUNNING",
         "step": 3} for r in range(2)])
    now = time.time()
    store.add_metrics(job["id"], attempt.number, [
        {"rank": r, "step": s, "time": now + s, "loss": 5.0 - s} for s in (1, 2, 3) for r in (0, 1)])
    # The compression and MoE metrics the loop reports on some layouts (here step 3 only).
    store.add_metrics(job["id"], attempt.number, [
        {"rank": 0, "step": 4, "time": now + 4, "loss": 1.0, "grad_comm_bytes": 69_000,
         "grad_compression_ratio": 49.9, "moe_aux_loss": 1.03}])
    store.add_logs(job["id"], attempt.number, [{"rank": 0, "line": f"line {i}"} for i in range(5)])
    store.add_diagnosis(job["id"], attempt.number, verdict="STRAGGLER", culprit_ranks=[1],
                        summary="rank 1 is slow", report={"confidence": 0.9})
    base = f"/v1/jobs/{job['id']}"

    metrics = client.get(f"{base}/metrics", headers=auth).json()["items"]
    assert len(metrics) == 7
    assert {"step", "loss", "rank", "time"} <= set(metrics[0])
    assert metrics[-2]["step"] == 3 and abs(metrics[-2]["time"] - (now + 3)) < 1e-3
    assert (metrics[-2]["grad_comm_bytes"], metrics[-2]["moe_aux_loss"]) == (None, None)
    assert (metrics[-1]["grad_comm_bytes"], metrics[-1]["grad_compression_ratio"],
            metrics[-1]["moe_aux_loss"]) == (69_000, 49.9, 1.03)
    only = client.get(f"{base}/metrics", params={"rank": 1, "after_step": 1}, headers=auth)
    assert [(p["rank"], p["step"]) for p in only.json()["items"]] == [(1, 2), (1, 3)]

    ranks = client.get(f"{base}/ranks", headers=auth).json()["items"]
    assert [(r["rank"], r["gpu"], r["coords"]) for r in ranks] == \
        [(0, 0, {"dp_replicate": 0}), (1, 1, {"dp_replicate": 1})]
    attempts = client.get(f"{base}/attempts", headers=auth).json()["items"]
    assert [(a["number"], a["placement"]) for a in attempts] == [(1, {"nodes": ["n0"]})]
    tail = client.get(f"{base}/logs", params={"tail": 2}, headers=auth).json()["items"]
    assert [x["line"] for x in tail] == ["line 3", "line 4"]
    diag = client.get(f"{base}/diagnoses", headers=auth).json()["items"]
    assert diag[0]["verdict"] == "STRAGGLER" and diag[0]["culprit_ranks"] == [1]

    detail = client.get(base, headers=auth).json()
    assert (detail["state"], detail["last_step"], detail["last_loss"]) == ("PLACING", 4, 1.0)
    events = client.get(f"{base}/events", headers=auth).json()["items"]
    assert [e["dst"] for e in events] == ["QUEUED", "PLACING"]


def test_cluster_shape_rejects_specs_that_can_never_fit(env) -> None:
    client, store, auth, _ = env
    store.upsert_node(name="gpu-0", node_id="n0", gpus=4, cpus=32,
                      topology={"gpus": [{"index": i} for i in range(4)]})
    spec = {"name": "wide-tp", "resources": {"device": "cuda"},
            "model": {"n_heads": 8, "d_model": 256}, "parallelism": {"tp": 8}}
    r = client.post("/v1/jobs", json=spec, headers=auth)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == "parallelism.tp"
    assert "largest node has 4 GPUs" in r.json()["errors"][0]["msg"]
    relaxed = {**spec, "placement": {"mode": "preferred"}}
    assert client.post("/v1/jobs", json=relaxed, headers=auth).status_code == 201
    cluster = client.get("/v1/cluster", headers=auth).json()
    assert (cluster["total_gpus"], cluster["nodes"][0]["name"]) == (4, "gpu-0")
    topo = client.get("/v1/cluster/topology", headers=auth).json()["nodes"]
    assert topo == [{"name": "gpu-0", "node_id": "n0",
                     "topology": {"gpus": [{"index": i} for i in range(4)]}}]


def test_fault_injection_accepted_when_enabled(env) -> None:
    client, _, auth, _ = env
    spec = {"name": "faulty", "parallelism": {"dp_replicate": 2},
            "inject_fault": {"kind": "hang", "rank": 1, "step": 2}}
    r = client.post("/v1/jobs", json=spec, headers=auth)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["inject_fault"]["rank"] == 1


def test_illegal_transition_is_409_problem(env) -> None:
    client, store, auth, _ = env
    job = client.post("/v1/jobs", json={"name": "t"}, headers=auth).json()
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)

    @client.app.get("/v1/_test/revive/{job_id}")  # type: ignore[attr-defined]
    def revive(job_id: str) -> dict:
        store.transition(job_id, JobState.RUNNING, reason=Reason.FIRST_STEP)
        return {}

    r = client.get(f"/v1/_test/revive/{job['id']}")
    assert r.status_code == 409
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "CANCELLED -> RUNNING" in r.json()["detail"]


def test_unhandled_error_is_a_500_problem_without_traceback(env) -> None:
    client, _, _, _ = env

    @client.app.get("/v1/_test/boom")  # type: ignore[attr-defined]
    def boom() -> dict:
        raise RuntimeError("secret internals")

    r = client.get("/v1/_test/boom")
    assert r.status_code == 500
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "secret internals" not in r.text


def test_readyz_reports_a_schema_behind_head(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d")  # no migrations applied
    app = create_app(settings)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["database"] is True and r.json()["migrations"] is False
        assert "meshyard db upgrade" in r.json()["detail"]
        assert client.get("/healthz").status_code == 200


def test_cluster_shape_is_cached_for_its_ttl(env) -> None:
    _, store, _, _ = env
    now = [100.0]
    shape = ClusterShape(store, ttl_s=2, clock=lambda: now[0])
    assert shape.max_gpus_per_node() == 0  # no nodes yet
    store.upsert_node(name="n0", gpus=4)
    store.upsert_node(name="n1", gpus=8)
    now[0] += 1.9
    assert shape.max_gpus_per_node() == 0  # still the cached answer
    now[0] += 0.1
    assert shape.max_gpus_per_node() == 8
    store.upsert_node(name="n2", gpus=16)
    assert shape.max_gpus_per_node() == 8
    now[0] += 2
    assert shape.max_gpus_per_node() == 16


def test_list_items_match_the_detail_without_spec(env) -> None:
    client, store, auth, _ = env
    job = client.post("/v1/jobs", json={"name": "same", "priority": 7}, headers=auth).json()
    store.set_pending_reason(job["id"], {"code": "NO_RESOURCES", "needs_gpus": 2})
    detail = client.get(f"/v1/jobs/{job['id']}", headers=auth).json()
    listed = client.get("/v1/jobs", params={"name": "same"}, headers=auth).json()["items"]
    assert listed == [{k: v for k, v in detail.items() if k != "spec"}]
    assert detail["spec"]["priority"] == 7 and detail["created_at"].endswith("Z")
