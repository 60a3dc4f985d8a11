"""Per-rank logs over REST and `meshyard logs ID --rank N [-f]`, against a real uvicorn.

The lines are written the way the control plane's poller writes them (store.add_logs); the
follow stream must deliver lines written after it started and end when the job does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from api.app import create_app
from api.cli import app as cli_app
from api.server import bind_socket
from orchestrator.lifecycle import JobState, Reason
from orchestrator.settings import Settings
from orchestrator.spec import parse_spec
from orchestrator.store import open_store
from orchestrator.store.repo import Store


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[str, str, Store]]:
    store = open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    token = store.create_token("admin", admin=True)
    app = create_app(Settings(data_dir=tmp_path), store=store)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", token, store
    finally:
        server.should_exit = True
        thread.join(10)
        store.close()


def _running_job(store: Store) -> str:
    job, _ = store.submit_job(parse_spec({"name": "logs"}), owner="admin")
    for dst in (JobState.PLACING, JobState.STARTING, JobState.RUNNING):
        store.transition(job.id, dst, reason=Reason.PLACEMENT_FOUND)
    store.start_attempt(job.id, placement=None)
    store.add_logs(job.id, 1, [{"rank": r, "stream": "stdout", "line": f"r{r} line {i}"}
                               for i in range(5) for r in (0, 1)])
    return job.id


def test_logs_of_one_rank_with_tail(served):
    url, token, store = served
    job_id = _running_job(store)
    result = CliRunner().invoke(cli_app, ["logs", job_id, "--rank", "1", "--tail", "2",
                                          "--url", url, "--token", token])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["r1 line 3", "r1 line 4"]
    every = CliRunner().invoke(cli_app, ["logs", job_id, "--url", url, "--token", token])
    assert "[rank 0 stdout] r0 line 0" in every.output.splitlines()
    assert len(every.output.splitlines()) == 10


def test_follow_streams_new_lines_until_the_job_ends(served):
    url, token, store = served
    job_id = _running_job(store)

    def later() -> None:
        time.sleep(1.5)
        store.add_logs(job_id, 1, [{"rank": 0, "stream": "stderr", "line": "late line"},
                                   {"rank": 1, "stream": "stdout", "line": "other rank"}])
        time.sleep(0.5)
        store.transition(job_id, JobState.SUCCEEDED, reason=Reason.COMPLETED)

    writer = threading.Thread(target=later)
    writer.start()
    result = CliRunner().invoke(cli_app, ["logs", job_id, "--rank", "0", "-f", "--url", url,
                                          "--token", token])
    writer.join()
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"r0 line {i}" for i in range(5)] + ["late line"]


def test_follow_of_an_unknown_job_is_an_error(served):
    url, token, _ = served
    result = CliRunner().invoke(cli_app, ["logs", "job-nope", "-f", "--url", url,
                                          "--token", token])
    assert result.exit_code == 1
    assert "404" in result.output
