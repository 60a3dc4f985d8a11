"""Per-user quotas at submission, set by admins over REST and the CLI (real server, both
databases). By hand, before: one user queued 400 jobs in 1.4 s, and a plain user's
`priority: 1000` job went ahead of everyone's."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.server import prepare
from orchestrator.settings import Settings
from tests.integration.api.conftest import Server, Users, run_cli


def _user(server: Server) -> tuple[str, str]:
    name = f"q-{uuid.uuid4().hex[:6]}"
    return name, server.create_token(name)


def _assert_quota(r: object, quota: str, limit: float) -> None:
    assert r.status_code == 429, r.text  # type: ignore[attr-defined]
    body = r.json()  # type: ignore[attr-defined]
    assert r.headers["content-type"].startswith("application/problem+json")  # type: ignore[attr-defined]
    assert body["type"] == "urn:meshyard:problem:quota-exceeded"
    assert (body["quota"], body["limit"]) == (quota, limit)
    assert f"quota {quota}=" in body["detail"]


def test_queued_jobs_quota_set_over_rest(server: Server, users: Users) -> None:
    name, token = _user(server)
    with server.client(users.admin) as admin, server.client(token) as http:
        r = admin.put(f"/v1/users/{name}/quota", json={"max_queued_jobs": 3})
        assert r.status_code == 200 and r.json()["max_queued_jobs"] == 3
        assert r.json()["explicit"] == ["max_queued_jobs"]
        ids = [http.post("/v1/jobs", json={"name": f"q{i}"}).json()["id"] for i in range(2)]
        key = {"Idempotency-Key": "k1"}
        ids.append(http.post("/v1/jobs", json={"name": "q2"}, headers=key).json()["id"])
        _assert_quota(http.post("/v1/jobs", json={"name": "q3"}), "max_queued_jobs", 3)
        # a retry of an accepted submission is not a new job: it is still answered
        again = http.post("/v1/jobs", json={"name": "q2"}, headers=key)
        assert again.status_code == 200 and again.json()["id"] == ids[2]
        http.post(f"/v1/jobs/{ids[0]}/cancel")
        assert http.post("/v1/jobs", json={"name": "q4"}).status_code == 201
        assert http.get(f"/v1/users/{name}/quota").json()["max_queued_jobs"] == 3  # own quota
        assert http.put(f"/v1/users/{name}/quota", json={}).status_code == 403  # admins only
        assert http.get("/v1/users/alice/quota").status_code == 403


def test_concurrent_submissions_cannot_pass_the_queued_quota(server: Server,
                                                             users: Users) -> None:
    name, token = _user(server)
    with server.client(users.admin) as admin:
        assert admin.put(f"/v1/users/{name}/quota", json={"max_queued_jobs": 3}).status_code == 200
    codes: list[int] = []

    def submit(i: int) -> None:
        with server.client(token) as http:
            codes.append(http.post("/v1/jobs", json={"name": f"race{i}"}).status_code)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(codes) == [201] * 3 + [429] * 7, codes


def test_priority_is_capped_for_non_admins_by_default(server: Server, users: Users) -> None:
    name, token = _user(server)
    with server.client(token) as http, server.client(users.admin) as admin:
        _assert_quota(http.post("/v1/jobs", json={"name": "p", "priority": 1000}),
                      "max_priority", 0)
        assert http.post("/v1/jobs", json={"name": "p", "priority": 0}).status_code == 201
        assert http.post("/v1/jobs", json={"name": "p", "priority": -5}).status_code == 201
        assert admin.post("/v1/jobs", json={"name": "p", "priority": 1000}).status_code == 201


def test_quota_cli_over_the_api(server: Server, users: Users, tmp_path: Path) -> None:
    name, token = _user(server)
    env = {"MESHYARD_URL": server.url, "MESHYARD_TOKEN": users.admin}
    out = run_cli("quota", "set", "--user", name, "--max-priority", "5", "--max-running-gpus",
                  "4", data_dir=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    shown = run_cli("quota", "show", "--user", name, data_dir=tmp_path, env=env)
    assert shown.returncode == 0
    assert "max_priority       5" in shown.stdout and "(set)" in shown.stdout
    assert "max_queued_jobs    100" in shown.stdout and "(default)" in shown.stdout
    with server.client(token) as http:
        assert http.post("/v1/jobs", json={"name": "p", "priority": 5}).status_code == 201
        _assert_quota(http.post("/v1/jobs", json={"name": "p", "priority": 6}), "max_priority", 5)
        big = {"name": "g", "resources": {"device": "cuda"}, "parallelism": {"dp_replicate": 8}}
        _assert_quota(http.post("/v1/jobs", json=big), "max_running_gpus", 4)
    denied = run_cli("quota", "set", "--user", name, "--max-priority", "1000",
                     data_dir=tmp_path, env={**env, "MESHYARD_TOKEN": token})
    assert denied.returncode == 1 and "HTTP 403" in denied.stderr


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings = Settings(data_dir=tmp_path / "data", default_max_queued_jobs=2,
                        default_max_running_cpus=3)
    prepared = prepare(settings)
    token = prepared.store.create_token("dora")
    with TestClient(create_app(settings, store=prepared.store),
                    base_url="http://127.0.0.1") as client:
        yield client, {"Authorization": f"Bearer {token}"}
    prepared.store.close()


def test_server_defaults_apply_to_users_without_a_quota(tight) -> None:
    client, auth = tight
    cpu = {"resources": {"device": "cpu"}}
    _assert_quota(client.post("/v1/jobs", json={"name": "c", **cpu,
                                                "parallelism": {"dp_replicate": 4}},
                              headers=auth), "max_running_cpus", 3)
    for i in range(2):
        assert client.post("/v1/jobs", json={"name": f"d{i}", **cpu}, headers=auth
                           ).status_code == 201
    _assert_quota(client.post("/v1/jobs", json={"name": "d2", **cpu}, headers=auth),
                  "max_queued_jobs", 2)
