"""The control plane dies for real (SIGKILL of `meshyard serve`) in the middle of a job and
comes back: it reattaches to the detached controller by name, resumes from its cursor, the
job finishes, and no state change, metric or log line is lost or written twice."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from api.client import MeshyardClient
from tests.integration.runtime.conftest import (
    serve_url,
    start_serve,
    stop_serve,
    tiny_spec,
    write_cluster_file,
)

TOKEN = "reconcile-test-admin-token"


def _wait(client: MeshyardClient, job_id: str, pred: Any, timeout_s: float = 240) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get_job(job_id)
        if pred(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"timed out; last {job}")


@pytest.mark.slow
def test_control_plane_killed_mid_job_loses_nothing(ray_cluster, tmp_path):
    cluster_file = write_cluster_file(tmp_path / "cluster.yaml")
    steps = 40
    spec = tiny_spec("survivor", training={"steps": steps},
                     inject_fault={"kind": "slow", "rank": 1, "step": 1, "seconds": 0.2,
                                   "attempt": None})
    proc = start_serve(tmp_path, token=TOKEN, address=ray_cluster.address,
                       cluster_file=cluster_file, extra=("--allow-fault-injection",))
    try:
        with MeshyardClient(serve_url(tmp_path, proc, token=TOKEN), TOKEN) as client:
            job_id = client.submit(spec).id
            _wait(client, job_id, lambda j: j.state.value == "RUNNING" and (j.last_step or 0) >= 3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        time.sleep(2.0)  # training goes on without a control plane
        proc = start_serve(tmp_path, token=TOKEN, address=ray_cluster.address,
                       cluster_file=cluster_file, extra=("--allow-fault-injection",))
        with MeshyardClient(serve_url(tmp_path, proc, token=TOKEN), TOKEN) as client:
            job = _wait(client, job_id, lambda j: j.state.value in ("SUCCEEDED", "FAILED"))
            assert job.state.value == "SUCCEEDED", job.message
            states = [e.dst.value if hasattr(e.dst, "value") else e.dst
                      for e in client.events(job_id) if e.kind == "state"]
            metric_steps = [m.step for m in client.metrics(job_id, rank=0).items]
            logs = client.logs(job_id, rank=0, limit=10000).items
            attempts = [a.state for a in client.attempts(job_id).items]
    finally:
        stop_serve(proc)
    assert states == ["QUEUED", "PLACING", "STARTING", "RUNNING", "SUCCEEDED"]
    assert attempts == ["SUCCEEDED"]  # reattached: no restart was needed
    assert metric_steps == list(range(1, steps + 1))  # every step once: nothing lost or doubled
    log_dir = tmp_path / "runs" / job_id / "logs" / "attempt-1"
    for stream in ("stdout", "stderr"):  # every captured line reached the database, once
        in_db = [x.line for x in logs if x.stream == stream]
        assert in_db == (log_dir / f"rank-0.{stream}").read_text().splitlines()
    assert logs  # the rank wrote something
