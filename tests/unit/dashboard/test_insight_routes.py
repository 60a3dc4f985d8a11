"""The /v1 routes behind the dashboard's job and cluster panels (FastAPI TestClient on a real
SQLite store): condition and rank states, usage, checkpoints, stacks requests, log filters and
download, Prometheus, `meshyard status`; and their bounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from orchestrator.admission.access import Role
from orchestrator.lifecycle import JobState
from orchestrator.mesh import MeshShape
from orchestrator.settings import Settings
from orchestrator.store.repo import Store
from tests.unit.dashboard.conftest import TOKEN
from tests.unit.dashboard.seed import (
    add_node_usage,
    add_usage,
    hang_report,
    open_condition,
    place,
    seed_cluster,
    spec_doc,
    submit,
    walk,
)

S = JobState


@pytest.fixture
def client(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path, database_url=str(store.engine.url)),
                     store=store)
    with TestClient(app, base_url="http://127.0.0.1:8470",
                    headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def running(store: Store, name: str = "j") -> tuple[str, int, list[str]]:
    nodes = seed_cluster(store)
    job = submit(store, spec_doc(name, dp_replicate=8))
    walk(store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    return job.id, place(store, job, nodes[:1], step=3), nodes


def test_condition_and_rank_states_follow_the_open_diagnosis(client: TestClient,
                                                              store: Store) -> None:
    job_id, attempt, nodes = running(store)
    job = store.get_job(job_id)
    assert job is not None
    d = open_condition(store, job, attempt, hang_report(world=8, culprit=5, mesh=MeshShape(
        dp_replicate=8), nodes=nodes[:1]), since=1764572181.0)
    body = client.get(f"/v1/jobs/{job_id}").json()
    assert body["condition"]["text"] == \
        "hung since 06:56:21 UTC — rank 5 never entered all_reduce #7"
    assert body["condition"]["diagnosis_id"] == d and body["status"] == body["condition"]["text"]
    listed = client.get("/v1/jobs").json()["items"][0]
    assert listed["condition"]["culprit_ranks"] == [5]
    ranks = client.get(f"/v1/jobs/{job_id}/ranks").json()["items"]
    assert [r["condition"]["state"] for r in ranks] == ["waiting"] * 5 + ["not_joined"] + \
        ["waiting"] * 2
    assert client.get(f"/v1/jobs/{job_id}/ranks?attempt=2").json()["items"] == []
    metrics = client.get("/metrics").text
    line = next(x for x in metrics.splitlines()
                if x.startswith("meshyard_job_condition_since_seconds{"))
    assert f'job_id="{job_id}"' in line and 'culprit_ranks="5"' in line
    assert line.endswith(" 1.764572181e+09")
    # The attempt ends: the condition goes with it.
    walk(store, job_id, S.FAILED)
    assert client.get(f"/v1/jobs/{job_id}").json()["condition"] is None
    assert all(r["condition"] is None
               for r in client.get(f"/v1/jobs/{job_id}/ranks").json()["items"])


def test_usage_checkpoints_and_cluster_usage(client: TestClient, store: Store) -> None:
    job_id, attempt, nodes = running(store)
    job = store.get_job(job_id)
    assert job is not None
    add_usage(store, job, attempt, ranks=8, nodes=nodes[:1], samples=5)
    add_node_usage(store, nodes[:2], samples=3, gpus=2)
    items = client.get(f"/v1/jobs/{job_id}/usage?rank=3").json()["items"]
    assert len(items) == 5 and items[0]["at"] < items[-1]["at"]
    assert items[-1]["gpu_util"] == 53.0 and items[-1]["node"] == nodes[0]
    since = items[2]["at"]
    assert len(client.get(f"/v1/jobs/{job_id}/usage?rank=3&since={since}").json()["items"]) == 2
    assert len(client.get(f"/v1/jobs/{job_id}/usage?limit=3").json()["items"]) == 3
    node = client.get(f"/v1/cluster/usage?node={nodes[1]}").json()["items"]
    assert len(node) == 3 and [g["index"] for g in node[0]["gpus"]] == [0, 1]
    for step in (2, 4, 6):
        store.add_checkpoint(job_id, attempt, {"step": step, "path": f"/c/step_{step}",
                                               "size_bytes": 1000 * step, "time": time.time(),
                                               "kept": [s for s in (2, 4, 6) if s >= step - 2]})
    ckpts = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    assert [(c["step"], c["removed"], c["size_bytes"]) for c in ckpts] == [
        (2, True, 2000), (4, False, 4000), (6, False, 6000)]
    store.prune_node_usage(before=time.time() + 1)
    assert client.get("/v1/cluster/usage").json()["items"] == []
    for bad in ("since=-1", "since=1e12", "limit=0", "limit=20001"):
        assert client.get(f"/v1/jobs/{job_id}/usage?{bad}").status_code == 422, bad


def test_stacks_requests_one_at_a_time_for_writers_of_running_jobs(
        client: TestClient, store: Store) -> None:
    job_id, attempt, _ = running(store)
    r = client.post(f"/v1/jobs/{job_id}/stacks")
    assert r.status_code == 202 and r.json()["state"] == "pending"
    req = r.json()["id"]
    assert r.headers["location"] == f"/v1/jobs/{job_id}/stacks/{req}"
    busy = client.post(f"/v1/jobs/{job_id}/stacks")
    assert busy.status_code == 409 and f"stacks/{req}" in busy.json()["detail"]
    store.update_stack_request(req, state="done", result={
        "groups": [{"stack": "a", "ranks": [0, 1], "ranks_text": "0-1",
                    "threads": ["MainThread (training)"], "training": True}],
        "ranks_answered": 2, "errors": {"2": "its process is gone"}, "error": ""})
    got = client.get(f"/v1/jobs/{job_id}/stacks/{req}").json()
    assert got["state"] == "done" and got["groups"][0]["ranks"] == [0, 1]
    assert got["errors"] == {"2": "its process is gone"}
    assert client.get(f"/v1/jobs/{job_id}/stacks").json()["items"][0]["id"] == req
    assert client.get(f"/v1/jobs/{job_id}/stacks/999").status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/stacks/0").status_code == 422
    viewer = store.create_token("vic", role=Role.VIEWER)
    assert client.post(f"/v1/jobs/{job_id}/stacks",
                       headers={"Authorization": f"Bearer {viewer}"}).status_code == 403
    queued = submit(store, spec_doc("waiting"))
    r = client.post(f"/v1/jobs/{queued.id}/stacks")
    assert r.status_code == 409 and "running workers" in r.json()["detail"]
    assert store.open_stack_requests() == []


def test_logs_filters_paging_and_download(client: TestClient, store: Store) -> None:
    job_id, attempt, _ = running(store)
    store.add_logs(job_id, attempt, [{"rank": i % 2, "stream": "stderr" if i % 4 == 0 else
                                      "stdout", "line": f"line {i} 100%_done"}
                                     for i in range(40)])
    get = lambda q: client.get(f"/v1/jobs/{job_id}/logs?{q}").json()["items"]  # noqa: E731
    assert len(get("rank=0&stream=stderr")) == 10
    assert [x["line"] for x in get("q=line 3")] == [f"line {i} 100%_done"
                                                    for i in [3, *range(30, 40)]]
    assert len(get("q=100%25_")) == 40  # % and _ are text, not LIKE wildcards
    newest = get("tail=5")
    assert [x["line"].split()[1] for x in newest] == ["35", "36", "37", "38", "39"]
    older = get(f"before={newest[0]['id']}&limit=5")
    assert [x["line"].split()[1] for x in older] == ["30", "31", "32", "33", "34"]
    assert get("attempt=2") == []
    r = client.get(f"/v1/jobs/{job_id}/logs/download?rank=1")
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    assert r.text.splitlines() == [f"line {i} 100%_done" for i in range(1, 40, 2)]
    assert client.get(f"/v1/jobs/{job_id}/logs/download").status_code == 422
    assert client.get(f"/v1/jobs/{job_id}/logs?stream=other").status_code == 422
    assert client.get(f"/v1/jobs/{job_id}/logs?before=0").status_code == 422


def test_status_cli_prints_the_condition(client: TestClient, store: Store,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from api import client as api_client
    from api.cli import app as cli

    job_id, attempt, nodes = running(store)
    job = store.get_job(job_id)
    assert job is not None
    open_condition(store, job, attempt, hang_report(world=8, culprit=5, mesh=MeshShape(
        dp_replicate=8), nodes=nodes[:1]), since=1764572181.0)
    transport = InProcess(client)  # the CLI's HTTP client talks to this in-process app
    original = api_client.MeshyardClient.__init__

    def in_process(self: api_client.MeshyardClient, url: str, token: str | None,
                   **kw: object) -> None:
        original(self, url, token, transport=transport)

    monkeypatch.setattr(api_client.MeshyardClient, "__init__", in_process)
    out = CliRunner().invoke(cli, ["status", job_id, "--url", "http://127.0.0.1:8470",
                                   "--token", TOKEN])
    assert out.exit_code == 0, out.output
    assert "status:   hung since 06:56:21 UTC — rank 5 never entered all_reduce #7" in out.output
    assert "culprit:  5 (NOT_JOINED" in out.output


class InProcess(httpx.BaseTransport):
    """An httpx transport that hands each request to a Starlette TestClient (whichever HTTP
    library the TestClient itself is built on)."""

    def __init__(self, client: TestClient) -> None:
        self._client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        got = self._client.request(request.method, str(request.url),
                                   headers=dict(request.headers), content=request.read())
        return httpx.Response(got.status_code, headers=list(got.headers.multi_items()),
                              content=got.content)

