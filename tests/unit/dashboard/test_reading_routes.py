"""The /v1 additions behind the dashboard's jobs list, job header, submit page, checkpoints and
stacks (FastAPI TestClient on a real SQLite store): when a job first ran and who cancelled it,
the hung / straggling filter, `working_dir` on submission, a checkpoint's files as a tar (only
from the job's run dir, never through a link), and stack frames for groups stored as text."""

from __future__ import annotations

import io
import os
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

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
def settings(store: Store, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, database_url=str(store.engine.url))


@pytest.fixture
def client(store: Store, settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, store=store), base_url="http://127.0.0.1:8470",
                    headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def test_started_at_and_cancelled_by_in_the_list_and_the_job(client: TestClient,
                                                            store: Store) -> None:
    queued = submit(store, spec_doc("waits"))
    ran = submit(store, spec_doc("ran"))
    walk(store, ran.id, S.PLACING, S.STARTING, S.RUNNING)
    assert client.post(f"/v1/jobs/{queued.id}/cancel").json()["cancelled_by"] == "admin"
    cancelled = client.post(f"/v1/jobs/{ran.id}/cancel").json()
    assert cancelled["state"] == "CANCELLING" and cancelled["cancelled_by"] == "admin"
    walk(store, ran.id, S.CANCELLED)
    events = store.list_events(ran.id)
    running = next(e for e in events if e.dst == "RUNNING")
    got = client.get(f"/v1/jobs/{ran.id}").json()
    assert got["state"] == "CANCELLED" and got["cancelled_by"] == "admin"
    assert got["started_at"] is not None
    assert abs(time.mktime(time.strptime(got["started_at"][:19], "%Y-%m-%dT%H:%M:%S"))
               - time.mktime(running.at.utctimetuple())) < 1
    items = {j["id"]: j for j in client.get("/v1/jobs").json()["items"]}
    assert items[ran.id]["started_at"] == got["started_at"]
    assert items[queued.id]["started_at"] is None  # it never ran
    assert items[queued.id]["cancelled_by"] == "admin"
    fresh = submit(store, spec_doc("fresh"))
    assert client.get(f"/v1/jobs/{fresh.id}").json()["cancelled_by"] is None


def test_the_list_filters_hung_jobs(client: TestClient, store: Store) -> None:
    nodes = seed_cluster(store)
    hung = submit(store, spec_doc("hung", dp_replicate=8))
    walk(store, hung.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(store, hung, nodes[:1], step=3)
    fine = submit(store, spec_doc("fine"))
    walk(store, fine.id, S.PLACING, S.STARTING, S.RUNNING)
    job = store.get_job(hung.id)
    assert job is not None
    open_condition(store, job, attempt, hang_report(world=8, culprit=5, mesh=MeshShape(
        dp_replicate=8), nodes=nodes[:1]), since=1764572181.0)
    got = client.get("/v1/jobs?condition=hung").json()["items"]
    assert [j["id"] for j in got] == [hung.id]
    assert client.get("/v1/jobs?condition=straggling").json()["items"] == []
    both = client.get("/v1/jobs?condition=hung&state=RUNNING").json()["items"]
    assert [j["id"] for j in both] == [hung.id]
    bad = client.get("/v1/jobs?condition=slow")
    assert bad.status_code == 422 and "condition" in bad.text


def _zip(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()


def test_submission_names_an_uploaded_package_as_its_working_dir(client: TestClient) -> None:
    up = client.post("/v1/packages", content=_zip({"train.py": "print('hi')\n"}),
                     headers={"Content-Type": "application/zip"})
    assert up.status_code == 201, up.text
    package = up.json()["package"]
    spec = {"name": "script", "parallelism": {"dp_replicate": 1},
            "resources": {"device": "cpu"}, "entrypoint": {"command": ["python", "train.py"]}}
    r = client.post("/v1/jobs", params={"working_dir": package}, json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["entrypoint"]["working_dir"] == package
    no_entry = client.post("/v1/jobs", params={"working_dir": package},
                           json={"name": "builtin", "parallelism": {"dp_replicate": 1}})
    assert no_entry.status_code == 422
    assert no_entry.json()["errors"][0]["loc"] == "entrypoint"
    assert "no `entrypoint`" in no_entry.json()["errors"][0]["msg"]
    for bad in ("/home/me/code", "package:sha256:" + "A" * 64, "package:sha256:" + "a" * 65):
        assert client.post("/v1/jobs", params={"working_dir": bad},
                           json=spec).status_code == 422, bad
    unknown = client.post("/v1/jobs", params={"working_dir": "package:sha256:" + "0" * 64},
                          json=spec)
    assert unknown.status_code in (403, 404, 422) and "package" in unknown.text


def _checkpoint(store: Store, settings: Settings, job_id: str, attempt: int, step: int,
                files: dict[str, bytes], *, kept: list[int] | None = None) -> Path:
    folder = Path(settings.resolved_runs_dir) / job_id / "checkpoints" / f"step_{step:08d}"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    store.add_checkpoint(job_id, attempt, {"step": step, "path": str(folder),
                                           "size_bytes": sum(map(len, files.values())),
                                           "time": time.time(), "kept": kept or [step]})
    return folder


def test_a_checkpoint_downloads_as_a_tar_of_its_run_dir_files(
        client: TestClient, store: Store, settings: Settings, tmp_path: Path) -> None:
    nodes = seed_cluster(store)
    job = submit(store, spec_doc("ckpt", dp_replicate=2))
    walk(store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(store, job, nodes[:1], step=4)
    files = {".metadata": b"meta", "__0_0.distcp": os.urandom(3000),
             "rng/rank_0.pt": b"rng0"}
    _checkpoint(store, settings, job.id, attempt, 4, files)
    r = client.get(f"/v1/jobs/{job.id}/checkpoints/{attempt}/4/download")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-tar"
    assert f'filename="{job.id}-step4.tar"' in r.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert got == {f"{job.id}-step4/{k}": v for k, v in files.items()}

    # Pruned, unknown, and another user's job: 404 with what to do.
    store.add_checkpoint(job.id, attempt, {"step": 2, "path": "/gone", "size_bytes": 1,
                                           "time": time.time(), "kept": [4]})
    pruned = client.get(f"/v1/jobs/{job.id}/checkpoints/{attempt}/2/download")
    assert pruned.status_code == 404 and "pruned" in pruned.json()["detail"]
    assert client.get(f"/v1/jobs/{job.id}/checkpoints/{attempt}/9/download").status_code == 404
    for bad in ("0/4", "x/4", f"{attempt}/-1", f"{attempt}/99999999999"):
        assert client.get(f"/v1/jobs/{job.id}/checkpoints/{bad}/download").status_code == 422
    other = store.create_token("bob", role=Role.USER)
    assert client.get(f"/v1/jobs/{job.id}/checkpoints/{attempt}/4/download",
                      headers={"Authorization": f"Bearer {other}"}).status_code == 404

    # A link inside the checkpoint (to a file outside the run dir) refuses the download.
    secret = tmp_path / "secret.txt"
    secret.write_text("not the job's")
    linked = _checkpoint(store, settings, job.id, attempt, 6, {"a": b"x"}, kept=[4, 6])
    (linked / "b").symlink_to(secret)
    r = client.get(f"/v1/jobs/{job.id}/checkpoints/{attempt}/6/download")
    assert r.status_code == 422 and "symbolic link" in r.text and "not the job" not in r.text
    # A checkpoint whose path leads out of the run dir is not served either.
    store.add_checkpoint(job.id, attempt, {"step": 8, "path": str(tmp_path), "size_bytes": 1,
                                           "time": time.time(), "kept": [4, 6, 8]})
    r = client.get(f"/v1/jobs/{job.id}/checkpoints/{attempt}/8/download")
    assert r.status_code == 422 and "not inside" in r.text


def test_stacks_stored_as_text_come_back_with_their_frames(client: TestClient,
                                                           store: Store) -> None:
    nodes = seed_cluster(store)
    job = submit(store, spec_doc("stk", dp_replicate=2))
    walk(store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(store, job, nodes[:1], step=1)
    req = client.post(f"/v1/jobs/{job.id}/stacks").json()["id"]
    text = ('  File "<frozen runpy>", line 88, in _run_code\n'
            '  File "/code/train.py", line 7, in <module>\n    main()\n')
    store.update_stack_request(req, state="done", result={
        "groups": [{"stack": text, "ranks": [0, 1], "ranks_text": "0-1",
                    "threads": ["MainThread (training)"], "training": True}],
        "ranks_answered": 2})
    (group,) = client.get(f"/v1/jobs/{job.id}/stacks/{req}").json()["groups"]
    assert [(f["kind"], f["line"]) for f in group["frames"]] == [("wrapper", 88), ("user", 7)]
    assert group["frames"][1]["code"] == "main()"
