"""A spec that runs but is known to train badly is accepted with `warnings` in the submit
response, a warning event on the job, and the CLI prints them (in-process app, SQLite)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from api.cli.app import app as cli
from api.schemas import SubmitResult
from api.server import prepare
from orchestrator.settings import Settings
from orchestrator.store.repo import Store

TOPK = {"name": "topk", "parallelism": {"dp_replicate": 2}, "resources": {"device": "cpu"},
        "training": {"ddp": {"comm_hook": "topk"}}}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Store, dict[str, str]]]:
    settings = Settings(data_dir=tmp_path / "data")
    prepared = prepare(settings)
    app = create_app(settings, store=prepared.store)
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        yield client, prepared.store, {"Authorization": f"Bearer {prepared.admin_token}"}
    prepared.store.close()


def test_topk_without_a_warm_start_is_accepted_with_a_warning(env) -> None:
    client, store, auth = env
    r = client.post("/v1/jobs", json=TOPK, headers=auth)
    assert r.status_code == 201, r.text
    warnings = r.json()["warnings"]
    assert [w["loc"] for w in warnings] == ["training.ddp.topk_start_iter"]
    assert "topk from the first step learns much slower" in warnings[0]["msg"]
    events = [e for e in store.list_events(r.json()["id"]) if e.reason == "SPEC_WARNING"]
    assert [e.kind for e in events] == ["warning"]
    assert events[0].message.startswith("training.ddp.topk_start_iter: topk from the first")
    warm = {**TOPK, "name": "warm", "training": {"ddp": {"comm_hook": "topk",
                                                         "topk_start_iter": 100}}}
    plain = client.post("/v1/jobs", json=warm, headers=auth)
    assert plain.status_code == 201 and plain.json()["warnings"] == []


def test_the_cli_prints_the_warnings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = SubmitResult.model_validate({
        "id": "job-1", "name": "topk", "owner": "ann", "state": "QUEUED", "priority": 0,
        "submission_id": None, "world_size": 2, "total_steps": 100, "current_attempt": 0,
        "last_step": None, "last_loss": None, "pending_reason": None, "failure_reason": None,
        "message": "", "created_at": "2026-12-05T00:00:00Z",
        "updated_at": "2026-12-05T00:00:00Z", "spec": {}, "created": True,
        "warnings": [{"loc": "training.ddp.topk_start_iter", "msg": "topk from the ..."}]})
    monkeypatch.setattr("api.cli.job_cmds._run", lambda *a, **k: result)
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: topk\n")
    out = CliRunner().invoke(cli, ["submit", str(spec)])
    assert out.exit_code == 0, out.output
    assert "job-1 submitted" in out.output
    assert "warning: training.ddp.topk_start_iter: topk from the ..." in out.output
