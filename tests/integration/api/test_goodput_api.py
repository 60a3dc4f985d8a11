"""GET /v1/jobs/{id}/goodput, the job page's goodput panel and meshyard_job_goodput_ratio,
on the app in-process with a real SQLite store holding a job with a restart (its states,
metrics and diagnosis written as the poller writes them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.server import prepare
from orchestrator.lifecycle import JobState, Reason
from orchestrator.settings import Settings
from orchestrator.store.repo import Store

TICK = 0.05


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Store, dict[str, str]]]:
    settings = Settings(data_dir=tmp_path / "data")
    prepared = prepare(settings)
    app = create_app(settings, store=prepared.store, runtime=None)
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        yield client, prepared.store, {"Authorization": f"Bearer {prepared.admin_token}"}
    prepared.store.close()


def _steps(store: Store, job_id: str, attempt: int, steps: range) -> None:
    for s in steps:
        time.sleep(TICK)
        store.add_metrics(job_id, attempt, [{"rank": 0, "step": s, "time": time.time(),
                                             "loss": 1.0 / s}])


def _attempt(store: Store, job_id: str, n: int) -> None:
    store.transition(job_id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND,
                     data={"attempt": n})
    store.start_attempt(job_id, placement={})
    time.sleep(TICK)
    store.transition(job_id, JobState.STARTING, reason=Reason.PLACEMENT_FOUND)
    time.sleep(TICK)
    store.transition(job_id, JobState.RUNNING, reason=Reason.FIRST_STEP)


@pytest.mark.timeout(60)
def test_goodput_of_a_job_with_a_restart_adds_up(env) -> None:
    client, store, auth = env
    job = client.post("/v1/jobs", json={"name": "gp"}, headers=auth).json()
    jid = job["id"]
    time.sleep(TICK)
    _attempt(store, jid, 1)
    _steps(store, jid, 1, range(1, 7))
    time.sleep(4 * TICK)  # the stall
    store.add_diagnosis(jid, 1, verdict="NOT_JOINED", culprit_ranks=[1], summary="hang",
                        report={"details": {"detected_at": time.time()}})
    time.sleep(2 * TICK)
    store.transition(jid, JobState.RESTARTING, reason=Reason.HANG_DETECTED)
    store.transition(jid, JobState.QUEUED, reason=Reason.RESTART_SCHEDULED)
    time.sleep(TICK)
    _attempt(store, jid, 2)
    _steps(store, jid, 2, range(5, 11))  # steps 5 and 6 redone from the checkpoint at 4

    text = client.get("/metrics", headers=auth).text  # RUNNING: its ratio is exported
    line = next(ln for ln in text.splitlines()
                if ln.startswith("meshyard_job_goodput_ratio") and jid in ln)
    assert 0.0 < float(line.split()[-1]) < 1.0

    store.transition(jid, JobState.SUCCEEDED, reason=Reason.COMPLETED)
    g = client.get(f"/v1/jobs/{jid}/goodput", headers=auth).json()
    assert sum(g["seconds"].values()) == pytest.approx(g["wall_s"], abs=5e-3)  # rounded
    for bucket in ("queued", "starting", "productive", "recomputed", "hung", "recovering"):
        assert g["seconds"][bucket] > 0, (bucket, g["seconds"])
    assert g["steps_recomputed"] == 2
    assert g["ratio"] == pytest.approx(g["seconds"]["productive"] / g["wall_s"], abs=1e-3)
    assert g["seconds"]["hung"] >= 3 * TICK
    segs = g["segments"]
    assert all(a["end"] == pytest.approx(b["start"]) for a, b in zip(segs[:-1], segs[1:], strict=True))
    assert {s["attempt"] for s in segs} == {0, 1, 2}

    token = auth["Authorization"].split()[1]
    client.post("/login", content=f"token={token}",
                headers={"Content-Type": "application/x-www-form-urlencoded",
                         "Origin": "http://127.0.0.1"}, follow_redirects=False)
    html = client.get(f"/jobs/{jid}").text
    panel = html[html.index('id="goodput"'):]
    panel = panel[:panel.index("</section>")]
    assert "gp gp-hung" in panel and "gp gp-recomputed" in panel
    assert f"{g['ratio'] * 100:.1f}%" in panel and "2 steps recomputed" in panel
    assert client.get("/v1/jobs/nope/goodput", headers=auth).status_code in (404, 422)
