"""Roles and the deployment policy: who may run code, and which files a job may train on.

By hand, before: any user's `data.path: ../../../../etc/passwd` (or the control plane's own
database) was accepted, a viewer role did not exist, and which users may import code was not
a setting. The real server (both databases) for the defaults; the in-process app for the
policy settings an operator changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.server import prepare
from orchestrator.settings import Settings
from tests.integration.api.conftest import Server, Users

IMPORT = {"kind": "import", "path": "tests.integration.workers.user_model:build"}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_viewers_read_every_job_and_change_none(server: Server, users: Users) -> None:
    viewer = server.create_token(_name("vic"), role="viewer")
    with server.client(users.alice) as alice, server.client(viewer) as vic:
        job = alice.post("/v1/jobs", json={"name": _name("alices")}).json()
        assert vic.get(f"/v1/jobs/{job['id']}").status_code == 200  # reads any job
        assert job["id"] in {j["id"] for j in vic.get("/v1/jobs", params={"limit": 500})
                             .json()["items"]}
        for r in (vic.post("/v1/jobs", json={"name": "nope"}),
                  vic.post(f"/v1/jobs/{job['id']}/cancel")):
            assert r.status_code == 403, r.text
            body = r.json()
            assert body["policy"] == "roles" and "read-only" in body["detail"]
        assert alice.get(f"/v1/jobs/{job['id']}").json()["state"] == "QUEUED"
        assert vic.post("/v1/tokens", json={"label": "mine"}).status_code == 201  # own tokens
        assert vic.post("/v1/tokens", json={"user": "alice"}).status_code == 403


def test_only_admins_submit_jobs_that_are_never_preempted(server: Server, users: Users) -> None:
    fixed = {"name": _name("fixed"), "preemption": {"preemptible": False, "grace_s": 120}}
    with server.client(users.alice) as alice, server.client(users.admin) as admin:
        r = alice.post("/v1/jobs", json=fixed)
        assert r.status_code == 403, r.text
        assert r.json()["errors"][0]["loc"] == "preemption.preemptible"
        bad = alice.post("/v1/jobs", json={"name": "g", "preemption": {"grace_s": 86400}})
        assert bad.status_code == 422, bad.text
        assert bad.json()["errors"][0]["loc"] == "preemption.grace_s"
        ok = admin.post("/v1/jobs", json=fixed)
        assert ok.status_code == 201, ok.text
        assert ok.json()["spec"]["preemption"] == {"preemptible": False, "grace_s": 120.0}


def test_data_paths_outside_the_data_roots_are_refused(server: Server, users: Users) -> None:
    datasets = server.data_dir / "datasets"
    escapes = ["../../../../etc/passwd", "/etc/passwd", str(server.data_dir / "meshyard.db"),
               str(server.data_dir / "admin.token"), f"{datasets}/../meshyard.db",
               f"{datasets}-evil/x.txt"]
    with server.client(users.alice) as http:
        for path in escapes:
            r = http.post("/v1/jobs", json={"name": "data", "data": {"kind": "text_file",
                                                                     "path": path}})
            assert r.status_code == 422, (path, r.text)
            body = r.json()
            assert body["policy"] == "data_roots" and body["setting"] == "MESHYARD_DATA_ROOTS"
            assert body["errors"][0]["loc"] == "data.path"
        ok = http.post("/v1/jobs", json={"name": _name("data"), "data": {
            "kind": "text_file", "path": str(datasets.resolve() / "corpus.txt")}})
        assert ok.status_code == 201, ok.text


def test_isolated_mode_takes_a_users_imported_model_only_from_an_allowlist(
        server: Server, users: Users, tmp_path: Path) -> None:
    """An imported model runs in the worker actor, which isolated mode does not confine: a
    plain user's is refused unless an operator named the packages it may come from; user
    code (an entrypoint) is the confined way to run one's own model."""
    with server.client(users.alice) as http:
        r = http.post("/v1/jobs", json={"name": _name("byo"), "model": IMPORT})
        assert r.status_code == 403, r.text
        body = r.json()
        assert body["policy"] == "isolation" and body["errors"][0]["loc"] == "model.kind"
        assert "MESHYARD_ALLOWED_IMPORT_PREFIXES" in body["detail"]
        assert "entrypoint.function" in body["detail"]
    for extra in ({"isolation": "trusted"},
                  {"allowed_import_prefixes": ["tests.integration.workers"]}):
        settings = Settings(data_dir=tmp_path / str(len(extra)) / next(iter(extra)), **extra)
        prepared = prepare(settings)
        user = prepared.store.create_token("dora")
        with TestClient(create_app(settings, store=prepared.store),
                        base_url="http://127.0.0.1") as client:
            r = client.post("/v1/jobs", json={"name": "byo", "model": IMPORT},
                            headers={"Authorization": f"Bearer {user}"})
        prepared.store.close()
        assert r.status_code == 201, (extra, r.text)


@pytest.fixture
def policy_app(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], dict[str, str]]]:
    """Imports only for admins, only from tests.integration.workers; data under one root."""
    settings = Settings(data_dir=tmp_path / "data", code_roles=["admin"],
                        allowed_import_prefixes=["tests.integration.workers"],
                        data_roots=[str(tmp_path / "corpora")])
    prepared = prepare(settings)
    user = prepared.store.create_token("carol")
    app = create_app(settings, store=prepared.store)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield (client, {"Authorization": f"Bearer {prepared.admin_token}"},
               {"Authorization": f"Bearer {user}"})
    prepared.store.close()


def test_the_policy_settings_decide_who_runs_which_code(policy_app, tmp_path: Path) -> None:
    client, admin, user = policy_app
    r = client.post("/v1/jobs", json={"name": "byo", "model": IMPORT}, headers=user)
    assert r.status_code == 403, r.text
    assert r.json()["policy"] == "code_roles" and "MESHYARD_CODE_ROLES" in r.json()["detail"]
    for path in ("subprocess:run", "os:system", "tests.integration.workersx:build"):
        r = client.post("/v1/jobs", json={"name": "byo", "model": {"kind": "import",
                                                                   "path": path}}, headers=admin)
        assert r.status_code == 422, (path, r.text)
        assert r.json()["setting"] == "MESHYARD_ALLOWED_IMPORT_PREFIXES"
        assert r.json()["errors"][0]["loc"] == "model.path"
    r = client.post("/v1/jobs", json={"name": "byo", "model": IMPORT}, headers=admin)
    assert r.status_code == 201, r.text
    corpus = str(tmp_path / "corpora" / "a.txt")
    r = client.post("/v1/jobs", json={"name": "d", "data": {"kind": "text_file",
                                                            "path": corpus}}, headers=user)
    assert r.status_code == 201, r.text
    default_root = str(tmp_path / "data" / "datasets" / "a.txt")  # replaced by the setting
    r = client.post("/v1/jobs", json={"name": "d", "data": {"kind": "text_file",
                                                            "path": default_root}}, headers=user)
    assert r.status_code == 422 and r.json()["policy"] == "data_roots"


def test_fault_injection_needs_the_server_setting(policy_app) -> None:
    client, admin, _ = policy_app
    r = client.post("/v1/jobs", json={"name": "f", "parallelism": {"dp_replicate": 2},
                                      "inject_fault": {"kind": "hang", "rank": 1}}, headers=admin)
    assert r.status_code == 422 and "fault injection is disabled" in r.text
