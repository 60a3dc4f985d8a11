"""`make run`'s path as a new user gets it: `meshyard serve --demo` on a fresh data dir, no
Ray address, no test environment. The quickstart job trains to SUCCEEDED and every address
the job uses (Ray node, gloo rendezvous) is loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.client import MeshyardClient
from tests.integration.runtime.conftest import stop_serve


@pytest.mark.slow
def test_serve_demo_trains_quickstart_on_loopback(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "meshyard"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MESHYARD_"))}  # as on a fresh shell
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(exe), "serve", "--port", "0", "--data-dir",
                                 str(tmp_path / "data"), "--demo", "--no-access-log"],
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[3])
    try:
        job_id = url = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job_id is None:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            text = log_path.read_text()
            for line in text.splitlines():
                if line.startswith("demo job "):
                    job_id = line.split()[2]
                    url = line.rsplit(": ", 1)[1].split("/v1/")[0]
            time.sleep(0.5)
        assert job_id and url, log_path.read_text()[-3000:]
        token = (tmp_path / "data" / "admin.token").read_text().strip()
        with MeshyardClient(url, token) as client:
            while time.monotonic() < deadline:
                job = client.get_job(job_id)
                if job.state.value in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    break
                time.sleep(0.5)
            assert job.state.value == "SUCCEEDED", (job, log_path.read_text()[-3000:])
            ready = [e for e in client.events(job_id) if e.reason == "WORKERS_READY"]
        assert ready and ready[0].data["master"]["addr"] == "127.0.0.1", ready
        assert url.startswith("http://127.0.0.1:")
    finally:
        stop_serve(proc, timeout_s=60)
