"""No step's metrics lost to a crash, in the embedded default: `meshyard serve` with its own
local Ray is frozen (SIGSTOP: the poller stops while the ranks keep training and reporting),
then killed (SIGKILL: the local Ray goes down with it). On restart the attempt is lost, its
workers' metrics files are ingested once, and the job resumes from its checkpoint: the loss
curve has no gap and no step twice within an attempt."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from api.client import MeshyardClient
from orchestrator.store import open_store
from tests.integration.runtime.conftest import serve_url, start_serve, stop_serve, tiny_spec

TOKEN = "metrics-recovery-admin-token"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


def _serve_embedded(data_dir: Path) -> subprocess.Popen[bytes]:
    return start_serve(data_dir, token=TOKEN, extra=("--allow-fault-injection",))


def _wait(client: MeshyardClient, job_id: str, pred: Any, timeout_s: float = 240) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get_job(job_id)
        if pred(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"timed out; last {job}")


def _file_steps(run: Path, attempt: int, rank: int) -> list[int]:
    """The steps of a rank's metrics file, each once (a step's row is written when the step
    is done and again at the loop's next sync; a line cut by the kill is skipped)."""
    from orchestrator.runtime.metrics_files import read_rank_rows

    path = run / "logs" / f"attempt-{attempt}" / f"rank-{rank}.metrics.jsonl"
    return sorted(int(r["step"]) for r in read_rank_rows(path, rank=rank, run_dir=run))


def test_metrics_reported_after_the_last_poll_survive_sigkill(tmp_path: Path) -> None:
    # Long enough that the ranks, which train on while the server is stopped and for a moment
    # after it is killed, cannot finish the job before it restarts (with 40 steps they once
    # did: the restarted attempt then had no step left to train). Rank 1 sleeps 0.15 s a
    # step in the first attempt, so the 72 or more steps left after step 8 take over 10 s;
    # the resumed attempt trains at full speed.
    steps = 80
    spec = tiny_spec("no-gap", training={"steps": steps},
                     resources={"device": "cpu", "cpus_per_worker": 0.5},
                     checkpoint={"enabled": True, "every_steps": 5, "async_save": False},
                     inject_fault={"kind": "slow", "rank": 1, "step": 1, "seconds": 0.15,
                                   "attempt": 1})
    data = tmp_path / "data"
    proc = _serve_embedded(data)
    try:
        with MeshyardClient(serve_url(data, proc, token=TOKEN), TOKEN) as client:
            job_id = client.submit(spec).id
            _wait(client, job_id, lambda j: j.state.value == "RUNNING" and (j.last_step or 0) >= 8)
        os.kill(proc.pid, signal.SIGSTOP)  # no more polls; the ranks train on
        # Every row a poll fetched was in the file by now; wait until the ranks have written
        # rows past those (a step's row is written when the step is done).
        run = data / "runs" / job_id
        at_stop = max(_file_steps(run, 1, 0), default=0)
        deadline = time.monotonic() + 120
        while max(_file_steps(run, 1, 0), default=0) < at_stop + 3:
            assert time.monotonic() < deadline, "the ranks stopped training with the server"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # serve and the local Ray it started
        proc.wait(10)
        store = open_store(f"sqlite:///{data / 'meshyard.db'}")
        try:
            polled = max(m.step for m in store.list_metrics(job_id, rank=0))
        finally:
            store.close()
        assert max(_file_steps(run, 1, 0)) > polled, "steps no poll fetched must be left"

        proc = _serve_embedded(data)
        with MeshyardClient(serve_url(data, proc, token=TOKEN), TOKEN) as client:
            job = _wait(client, job_id, lambda j: j.state.value in ("SUCCEEDED", "FAILED"),
                        timeout_s=300)
            assert job.state.value == "SUCCEEDED", job.message
            points = client.metrics(job_id, rank=0).items
            attempts = client.attempts(job_id).items
    finally:
        stop_serve(proc)
    kept = _file_steps(run, 1, 0)  # the ranks may have trained on a moment after the kill
    assert [a.state for a in attempts][-1] == "SUCCEEDED"
    assert attempts[0].failure_reason == "CONTROLLER_LOST"
    first = [p.step for p in points if p.attempt == 1]
    assert first == kept  # every row the file kept, once, in order: recovered exactly once
    assert first == list(range(1, max(kept) + 1))
    later = [p.step for p in points if p.attempt == attempts[-1].number]
    assert later and later[0] <= max(first) + 1 and later[-1] == steps  # no gap in the curve
    assert len(later) == len(set(later))
