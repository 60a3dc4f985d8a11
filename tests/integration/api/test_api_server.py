"""The REST API through a real uvicorn process, on SQLite and PostgreSQL."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.api.conftest import REPO, Server, Users

SPEC = {"name": "api-test", "parallelism": {"dp_replicate": 2}, "training": {"steps": 5}}


def _submit(client: httpx.Client, spec: dict | None = None, **kwargs) -> httpx.Response:
    return client.post("/v1/jobs", json=spec or SPEC, **kwargs)


def _assert_problem(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["status"] == status
    assert {"type", "title", "status", "detail", "instance"} <= set(body)
    return body


def test_missing_or_bad_token_is_401(server: Server, users: Users) -> None:
    with server.client(None) as anon:
        r = anon.get("/v1/jobs")
        body = _assert_problem(r, 401)
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert body["instance"] == "/v1/jobs"
        _assert_problem(anon.post("/v1/jobs", json=SPEC), 401)
    with server.client("msy_not-a-real-token") as bad:
        _assert_problem(bad.get("/v1/jobs"), 401)
    with server.client(users.alice) as alice:
        assert alice.get("/v1/jobs").status_code == 200


def test_other_users_job_is_404_and_admin_sees_all(server: Server, users: Users) -> None:
    with server.client(users.alice) as alice, server.client(users.bob) as bob, \
            server.client(users.admin) as admin:
        job = _submit(alice, {**SPEC, "name": "alice-private"}).json()
        for path in ("", "/events", "/attempts", "/ranks", "/metrics", "/logs", "/diagnoses"):
            _assert_problem(bob.get(f"/v1/jobs/{job['id']}{path}"), 404)
        _assert_problem(bob.post(f"/v1/jobs/{job['id']}/cancel"), 404)
        assert job["id"] not in {j["id"] for j in bob.get("/v1/jobs?limit=500").json()["items"]}
        assert alice.get(f"/v1/jobs/{job['id']}").json()["owner"] == "alice"
        assert admin.get(f"/v1/jobs/{job['id']}").status_code == 200
        owners = {j["owner"] for j in admin.get("/v1/jobs", params={"owner": "alice"})
                  .json()["items"]}
        assert owners == {"alice"}
        # bob's failed cancel changed nothing
        assert alice.get(f"/v1/jobs/{job['id']}").json()["state"] == "QUEUED"


def test_idempotent_retry_returns_same_job(server: Server, users: Users) -> None:
    key = "retry-" + secrets.token_hex(4)
    with server.client(users.alice) as alice, server.client(users.bob) as bob:
        first = _submit(alice, {"spec": SPEC, "submission_id": key})
        again = _submit(alice, {"spec": SPEC, "submission_id": key})
        by_header = _submit(alice, SPEC, headers={"Idempotency-Key": key})
        assert (first.status_code, again.status_code, by_header.status_code) == (201, 200, 200)
        assert first.json()["id"] == again.json()["id"] == by_header.json()["id"]
        assert first.json()["created"] is True and again.json()["created"] is False
        assert first.headers["location"] == f"/v1/jobs/{first.json()['id']}"
        # the key is per user: bob's identical key is a different job
        assert _submit(bob, SPEC, headers={"Idempotency-Key": key}).json()["id"] \
            != first.json()["id"]
        reused = _assert_problem(_submit(alice, {"spec": {**SPEC, "name": "other"},
                                                 "submission_id": key}), 422)
        assert reused["errors"][0]["loc"] == "submission_id"
        assert first.json()["id"] in reused["errors"][0]["msg"]


def test_pagination_is_stable_while_jobs_are_added(server: Server, users: Users) -> None:
    name = "page-" + secrets.token_hex(4)
    with server.client(users.alice) as alice:
        made = [_submit(alice, {**SPEC, "name": name}).json()["id"] for _ in range(7)]
        params = {"name": name, "limit": 3}
        page1 = alice.get("/v1/jobs", params=params).json()
        added = [_submit(alice, {**SPEC, "name": name}).json()["id"] for _ in range(2)]
        seen = [j["id"] for j in page1["items"]]
        cursor = page1["next_cursor"]
        while cursor:
            page = alice.get("/v1/jobs", params={**params, "cursor": cursor}).json()
            seen += [j["id"] for j in page["items"]]
            cursor = page["next_cursor"]
        assert seen == list(reversed(made))  # newest first, no duplicates, no gaps
        fresh = alice.get("/v1/jobs", params={**params, "limit": 2}).json()["items"]
        assert [j["id"] for j in fresh] == list(reversed(added))
        _assert_problem(alice.get("/v1/jobs", params={"cursor": "garbage!"}), 422)


def test_fifty_concurrent_submissions_create_fifty_jobs(server: Server, users: Users) -> None:
    name = "burst-" + secrets.token_hex(4)

    def one(i: int) -> int:
        with server.client(users.alice) as c:
            return _submit(c, {**SPEC, "name": name},
                           headers={"Idempotency-Key": f"{name}-{i}"}).status_code

    with ThreadPoolExecutor(max_workers=50) as pool:
        statuses = list(pool.map(one, range(50)))
    assert statuses == [201] * 50
    with server.client(users.alice) as alice:
        jobs = alice.get("/v1/jobs", params={"name": name, "limit": 500}).json()["items"]
    assert len(jobs) == 50 and len({j["id"] for j in jobs}) == 50


def test_concurrent_retries_of_one_submission_make_one_job(server: Server,
                                                           users: Users) -> None:
    key = "race-" + secrets.token_hex(4)

    def one(_: int) -> tuple[int, str]:
        with server.client(users.alice) as c:
            r = _submit(c, SPEC, headers={"Idempotency-Key": key})
            return r.status_code, r.json()["id"]

    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(one, range(10)))
    assert len({job_id for _, job_id in results}) == 1
    assert sorted(s for s, _ in results) == [200] * 9 + [201]


def test_body_over_limit_is_413(server: Server, users: Users) -> None:
    big = b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    with server.client(users.alice) as alice:
        body = _assert_problem(alice.post("/v1/jobs", content=big,
                                          headers={"Content-Type": "application/json"}), 413)
        assert "1048576" in body["detail"]

        def chunks():  # no Content-Length: the server must count the streamed bytes
            for _ in range(32):
                yield b" " * 65536
            yield b"{}"

        _assert_problem(alice.post("/v1/jobs", content=chunks(),
                                   headers={"Content-Type": "application/json"}), 413)
        assert alice.get("/healthz").status_code == 200


def test_script_name_is_stored_verbatim(server: Server, users: Users) -> None:
    name = "<script>alert(1)</script>"
    with server.client(users.alice) as alice:
        job = _submit(alice, {**SPEC, "name": name}).json()
        assert alice.get(f"/v1/jobs/{job['id']}").json()["name"] == name
        listed = alice.get("/v1/jobs", params={"name": "<script>"}).json()["items"]
        assert name in {j["name"] for j in listed}


def test_yaml_submission(server: Server, users: Users) -> None:
    text = (REPO / "examples" / "quickstart.yaml").read_text()
    with server.client(users.alice) as alice:
        r = alice.post("/v1/jobs", content=text, headers={"Content-Type": "application/yaml"})
        assert r.status_code == 201, r.text
        job = alice.get(f"/v1/jobs/{r.json()['id']}").json()
        assert job["spec"]["name"] == job["name"]
        wrapped = "submission_id: yaml-1\nspec:\n  name: wrapped-yaml\n"
        r = alice.post("/v1/jobs", content=wrapped, headers={"Content-Type": "application/yaml"})
        assert r.status_code in (200, 201) and r.json()["submission_id"] == "yaml-1"
        bad = alice.post("/v1/jobs", content="name: [unclosed",
                         headers={"Content-Type": "application/yaml"})
        assert "invalid YAML" in _assert_problem(bad, 422)["errors"][0]["msg"]
        _assert_problem(alice.post("/v1/jobs", content="name: x",
                                   headers={"Content-Type": "text/csv"}), 415)


def test_hostile_documents_are_422_and_the_server_stays_up(server: Server, users: Users) -> None:
    bomb = "name: bomb\nmodel:\n  kind: import\n  path: a.b:c\n  kwargs:\n" \
        "    a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"    {c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    with server.client(users.alice) as alice:
        r = alice.post("/v1/jobs", content=bomb, headers={"Content-Type": "application/yaml"})
        assert "aliases" in _assert_problem(r, 422)["errors"][0]["msg"]
        deep = alice.post("/v1/jobs", content="[" * 200_000,
                          headers={"Content-Type": "application/json"})
        assert _assert_problem(deep, 422)["errors"][0]["loc"] == "<root>"
        assert alice.get("/healthz").status_code == 200


def test_job_subresources_and_events(server: Server, users: Users) -> None:
    with server.client(users.alice) as alice:
        job = _submit(alice).json()
        events = alice.get(f"/v1/jobs/{job['id']}/events").json()["items"]
        assert [(e["dst"], e["reason"]) for e in events] == [("QUEUED", "SUBMITTED")]
        cancelled = alice.post(f"/v1/jobs/{job['id']}/cancel").json()
        assert cancelled["state"] == "CANCELLED"
        assert alice.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "CANCELLED"
        after = alice.get(f"/v1/jobs/{job['id']}/events",
                          params={"after": events[-1]["id"]}).json()["items"]
        assert [(e["src"], e["dst"], e["reason"]) for e in after] == \
            [("QUEUED", "CANCELLED", "USER_CANCELLED")]
        for path in ("attempts", "ranks", "logs", "diagnoses"):
            assert alice.get(f"/v1/jobs/{job['id']}/{path}").json() == {"items": []}
        # metrics also name the user's metric keys (none yet)
        assert alice.get(f"/v1/jobs/{job['id']}/metrics").json() == {"items": [], "keys": []}
        states = {j["state"] for j in alice.get("/v1/jobs", params={"state": "CANCELLED"})
                  .json()["items"]}
        assert states == {"CANCELLED"}
        cluster = alice.get("/v1/cluster").json()
        assert set(cluster) == {"nodes", "total_gpus", "total_cpus", "isolation"}
        assert "nodes" in alice.get("/v1/cluster/topology").json()


def test_probes_metrics_and_openapi(server: Server, users: Users) -> None:
    with server.client(None) as anon:
        assert anon.get("/healthz").json() == {"status": "ok"}
        ready = anon.get("/readyz").json()
        assert ready["status"] == "ready" and ready["migrations"] is True
        text = anon.get("/metrics").text
        assert 'meshyard_jobs{state="QUEUED"}' in text
        assert 'meshyard_http_requests_total{method="POST",route="/v1/jobs",status="201"}' in text
        assert "meshyard_http_request_duration_seconds_bucket" in text
        ops = {op["operationId"] for p in anon.get("/openapi.json").json()["paths"].values()
               for op in p.values()}
        assert {"submitJob", "listJobs", "getJob", "cancelJob", "listJobEvents", "getCluster",
                "listJobMetrics", "readyz"} <= ops


def test_admin_token_file_is_private(server: Server) -> None:
    token_file: Path = server.data_dir / "admin.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().strip().startswith("msy_")


def test_python_client_round_trip(server: Server, users: Users) -> None:
    from api.client import MeshyardAPIError, MeshyardClient

    name = "client-" + secrets.token_hex(4)
    with MeshyardClient(server.url, users.alice) as client:
        job = client.submit({**SPEC, "name": name}, submission_id=name)
        assert job.created and client.submit({**SPEC, "name": name}, submission_id=name).id \
            == job.id
        assert [j.id for j in client.iter_jobs(name=name, limit=1)] == [job.id]
        assert client.cancel(job.id).state.value == "CANCELLED"
        assert client.wait(job.id, timeout_s=5).state.value == "CANCELLED"
        assert [e.dst for e in client.events(job.id)] == ["QUEUED", "CANCELLED"]
        assert client.metrics(job.id).items == [] and client.cluster().total_gpus >= 0
    with MeshyardClient(server.url, users.bob) as other, pytest.raises(MeshyardAPIError) as err:
        other.get_job(job.id)
    assert err.value.status == 404 and err.value.problem["instance"] == f"/v1/jobs/{job.id}"
