"""Checkpoints on object storage through the whole runtime (a real S3-compatible server on
127.0.0.1, the package's simulated cluster): a job of the built-in loop and a user function
each crash in attempt 1 and resume in attempt 2 from the store's newest complete checkpoint,
which their hosts downloaded before the ranks started; the job's list names the store's
addresses, the store keeps `checkpoint.keep` of them, and the API serves one as a tar."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.settings import Settings
from orchestrator.storage.object_storage import ObjectStorage
from tests.integration.runtime.conftest import (
    package_settings,
    submit,
    tiny_spec,
    wait_for,
    wait_state,
)
from tests.integration.runtime.usercode_helpers import USER_CODE, ship, user_spec
from tests.support.s3 import Gate, keys


@pytest.fixture()
def gate(s3) -> Iterator[Gate]:
    """The runtime reaches the store through this, so a test can take the store away."""
    g = Gate((s3.host, s3.port))
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture()
def settings(tmp_path, ray_cluster, storage: ObjectStorage, gate: Gate) -> Settings:
    return package_settings(tmp_path, ray_cluster, checkpoint_uri=storage.uri,
                            s3_endpoint=gate.endpoint, s3_access_key=storage.access_key,
                            s3_secret_key=storage.secret_key)


def _lines(store, job_id: str) -> list[str]:
    return [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]


@pytest.mark.slow
def test_built_in_job_resumes_from_the_store_and_retraces_the_same_losses(
        runtime, store, settings, storage: ObjectStorage, gate: Gate) -> None:
    """The store is down when attempt 2's hosts restore: they ask it again until it is back
    (the job's log says so once), and the attempt goes on."""
    job_id = submit(store, tiny_spec(
        "s3-crash", training={"steps": 6},
        inject_fault={"kind": "crash", "rank": 1, "step": 4, "attempt": 1},
        fault_tolerance={"max_failures": 1}))
    wait_for(store, job_id, lambda _: any(a.state == "FAILED"
                                          for a in store.list_attempts(job_id)),
             timeout_s=240, what="attempt 1's failure")
    gate.close()
    try:
        wait_for(store, job_id, lambda _: any("WARNING the checkpoint store" in x
                                              for x in _lines(store, job_id)),
                 timeout_s=120, what="the restore's word that the store is down")
    finally:
        gate.open()
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    by_attempt: dict[int, dict[int, float]] = {}
    for m in store.list_metrics(job_id, rank=0):
        by_attempt.setdefault(m.attempt, {})[m.step] = m.loss
    first, second = by_attempt[1], by_attempt[2]
    assert sorted(first) == [1, 2, 3] and sorted(second) == [3, 4, 5, 6]
    if first[3] is not None:  # the same model, optimizer and data position: the same loss
        assert second[3] == pytest.approx(first[3], rel=1e-4)
    lines = _lines(store, job_id)
    (down,) = [x for x in lines if "WARNING the checkpoint store" in x]
    assert f"the checkpoint store {storage.uri} failed the restore" in down, down
    assert "did not answer" in down and "asking again for up to 120 s" in down, down
    uri = storage.step_uri(job_id, 2)
    assert any(f"INFO checkpoint of step 2 downloaded from {uri} to 1 host(s)" in x
               for x in lines), lines[-20:]
    assert any("resumed from checkpoint at step 2" in x for x in lines)
    # the list: every checkpoint at its store address; keep=2 left steps 4 and 6 there
    listed = store.list_checkpoints(job_id)
    assert [(c.attempt, c.step, c.removed) for c in listed] == [
        (1, 2, True), (2, 4, False), (2, 6, False)]
    assert all(c.path == storage.step_uri(job_id, c.step) and c.size_bytes > 0 for c in listed)
    assert storage.complete_steps(job_id) == [4, 6]
    stored = keys(storage, job_id)
    assert "step_00000006/COMPLETE" in stored and "step_00000006/.metadata" in stored
    assert not any(k.startswith("step_00000002/") for k in stored)
    # the host kept its newest `keep` steps on its own disk, no more
    local = settings.resolved_runs_dir / job_id / "checkpoints"
    assert sorted(p.name for p in local.iterdir()) == ["step_00000004", "step_00000006"]
    _download(settings, store, job_id, listed[-1], stored)

    # another job started from this one's step 4: copied within the store, then downloaded
    resumed = submit(store, tiny_spec("s3-from", training={"steps": 8},
                                      checkpoint={"resume_from": {"job": job_id, "step": 4}}))
    job = wait_state(store, resumed, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    assert sorted({m.step for m in store.list_metrics(resumed, rank=0)}) == [5, 6, 7, 8]
    lines = _lines(store, resumed)
    assert any(f"started from {job_id}'s checkpoint of step 4 (" in x and
               f"files copied in {storage.uri})" in x for x in lines), lines[:20]
    assert any(f"downloaded from {storage.step_uri(resumed, 4)}" in x for x in lines)
    assert storage.complete_steps(resumed) == [6, 8] and storage.complete_steps(job_id) == [4, 6]
    # a step the store no longer keeps: the job fails at once, naming the setting
    gone = submit(store, tiny_spec("s3-gone", fault_tolerance={"max_failures": 2},
                                   checkpoint={"resume_from": {"job": job_id, "step": 2}}))
    job = wait_state(store, gone, JobState.FAILED, JobState.SUCCEEDED, timeout_s=120)
    assert job.state == JobState.FAILED and job.failure_reason == "SETUP_ERROR", job.message
    assert "checkpoint.resume_from" in job.message and "step 2" in job.message, job.message
    assert len(store.list_attempts(gone)) == 1


def _download(settings: Settings, store, job_id: str, ckpt, stored: list[str]) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    store.ensure_admin("s3-admin-token")
    auth = {"Authorization": "Bearer s3-admin-token"}
    with TestClient(create_app(settings, store=store), base_url="http://127.0.0.1:8470") as c:
        r = c.get(f"/v1/jobs/{job_id}/checkpoints/{ckpt.attempt}/{ckpt.step}/download",
                  headers=auth)
        assert r.status_code == 200, r.text
        with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
            names = sorted(m.name for m in tar.getmembers())
        prefix = f"step_{ckpt.step:08d}/"
        assert names == sorted(f"{job_id}-step{ckpt.step}/{k[len(prefix):]}"
                               for k in stored if k.startswith(prefix))
        r = c.get(f"/v1/jobs/{job_id}/checkpoints/1/2/download", headers=auth)
        assert r.status_code == 404 and "pruned" in r.text


@pytest.mark.slow
def test_user_function_resumes_from_the_store(runtime, store, settings,
                                              storage: ObjectStorage) -> None:
    ref = ship(settings, USER_CODE / "resume")
    job_id = submit(store, user_spec(
        "s3-resume", {"function": "train:loop", "config": {"steps": 6, "crash_at": 4},
                      "working_dir": ref},
        fault_tolerance={"max_failures": 1, "init_timeout_s": 60, "collective_timeout_s": 30,
                         "retry_on": {"exit_codes": [3]}}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    points = [(m.attempt, m.step, m.loss) for m in store.list_metrics(job_id, rank=0)]
    assert [(a, s) for a, s, _ in points] == [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (2, 6)]
    assert [loss for _, _, loss in points] == [s * (s + 1) for s in range(1, 7)]
    lines = _lines(store, job_id)
    assert "rank 0 resumed from step 3" in lines
    assert any(f"downloaded from {storage.step_uri(job_id, 3)}" in x for x in lines)
    listed = store.list_checkpoints(job_id)
    assert [(c.attempt, c.step) for c in listed] == [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5),
                                                     (2, 6)]
    assert all(c.path == storage.step_uri(job_id, c.step) for c in listed)
    assert storage.complete_steps(job_id) == [1, 2, 3, 4, 5, 6]  # every reported one kept
    assert [k for k in keys(storage, job_id) if k.startswith("step_00000006/")] == [
        "step_00000006/COMPLETE", "step_00000006/state.pt"]
