"""The control plane dies for real (SIGKILL of `meshyard serve`) in the middle of a job and
comes back: it reattaches to the detached controller by name, resumes from its cursor, the
job finishes, and no state change, metric or log line is lost or written twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from api.client import MeshyardClient
from tests.integration.runtime.conftest import tiny_spec, write_cluster_file

TOKEN = "reconcile-test-admin-token"


def _serve(data_dir: Path, address: str, cluster_file: Path) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).parent / "meshyard"
    env = dict(os.environ, MESHYARD_ADMIN_TOKEN=TOKEN, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    log = open(data_dir / "serve.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [str(exe), "serve", "--port", "0", "--data-dir", str(data_dir), "--ray-address", address,
         "--cluster-file", str(cluster_file), "--allow-fault-injection", "--no-access-log"],
        env=env, stdout=log, stderr=subprocess.STDOUT)


def _url(data_dir: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, (data_dir / "serve.log").read_text()[-3000:]
        try:
            info = json.loads((data_dir / "server.json").read_text())
            if info["pid"] == proc.pid:
                with MeshyardClient(str(info["url"]), TOKEN) as client:
                    if client.healthy():  # listening once the runtime has started
                        return str(info["url"])
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError("server did not start: " + (data_dir / "serve.log").read_text()[-3000:])


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
    proc = _serve(tmp_path, ray_cluster.address, cluster_file)
    try:
        with MeshyardClient(_url(tmp_path, proc), TOKEN) as client:
            job_id = client.submit(spec).id
            _wait(client, job_id, lambda j: j.state.value == "RUNNING" and (j.last_step or 0) >= 3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        time.sleep(2.0)  # training goes on without a control plane
        proc = _serve(tmp_path, ray_cluster.address, cluster_file)
        with MeshyardClient(_url(tmp_path, proc), TOKEN) as client:
            job = _wait(client, job_id, lambda j: j.state.value in ("SUCCEEDED", "FAILED"))
            assert job.state.value == "SUCCEEDED", job.message
            states = [e.dst.value if hasattr(e.dst, "value") else e.dst
                      for e in client.events(job_id) if e.kind == "state"]
            metric_steps = [m.step for m in client.metrics(job_id, rank=0).items]
            logs = client.logs(job_id, rank=0, limit=10000).items
            attempts = [a.state for a in client.attempts(job_id).items]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert states == ["QUEUED", "PLACING", "STARTING", "RUNNING", "SUCCEEDED"]
    assert attempts == ["SUCCEEDED"]  # reattached: no restart was needed
    assert metric_steps == list(range(1, steps + 1))  # every step once: nothing lost or doubled
    log_dir = tmp_path / "runs" / job_id / "logs" / "attempt-1"
    for stream in ("stdout", "stderr"):  # every captured line reached the database, once
        in_db = [x.line for x in logs if x.stream == stream]
        assert in_db == (log_dir / f"rank-0.{stream}").read_text().splitlines()
    assert logs  # the rank wrote something
