"""The submit route's check of `checkpoint.resume_from`: a kept checkpoint of the submitter's
own job (an admin: anyone's); 422 naming the field otherwise."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from orchestrator.admission.access import Role
from orchestrator.settings import Settings
from orchestrator.spec import parse_spec
from orchestrator.store.repo import Store
from tests.unit.dashboard.conftest import TOKEN


@pytest.fixture
def client(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path, database_url=str(store.engine.url))
    with TestClient(create_app(settings, store=store), base_url="http://127.0.0.1:8470",
                    headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def test_submit_checks_the_checkpoint_is_kept_and_the_job_is_yours(client: TestClient,
                                                                  store: Store) -> None:
    src, _ = store.submit_job(parse_spec({"name": "src"}), owner="alice")
    for step in (2, 4):
        store.add_checkpoint(src.id, 1, {"step": step, "path": f"checkpoints/step_{step:08d}",
                                         "time": time.time(), "kept": [4] if step == 4 else [2]})
    alice = {"Authorization": f"Bearer {store.create_token('alice', role=Role.USER)}"}
    bob = {"Authorization": f"Bearer {store.create_token('bob', role=Role.USER)}"}

    def submit(step: int, headers: dict | None = None, job: str = src.id):
        return client.post("/v1/jobs", headers=headers or {}, json={
            "name": "resumed", "checkpoint": {"resume_from": {"job": job, "step": step}}})

    ok = submit(4, alice)
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["checkpoint"]["resume_from"] == {"job": src.id, "step": 4}
    pruned = submit(2, alice)
    assert pruned.status_code == 422
    issue = pruned.json()["errors"][0]
    assert issue["loc"] == "checkpoint.resume_from.step" and "steps 4" in issue["msg"]
    theirs = submit(4, bob)  # another user's job reads as unknown
    assert theirs.status_code == 422
    assert theirs.json()["errors"][0]["loc"] == "checkpoint.resume_from.job"
    assert "of yours" in theirs.json()["errors"][0]["msg"]
    assert submit(4, job="job-000000000000").status_code == 422
    assert submit(4).status_code == 201  # an admin may start from anyone's
