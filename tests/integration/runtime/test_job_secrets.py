"""A job's code never sees the control plane's secrets (real `meshyard serve`, embedded Ray,
trusted mode: the built-in loop's imported model runs in the worker actor).

The server is started the way an operator would hand it secrets: a seeded
MESHYARD_ADMIN_TOKEN, the database URL both in MESHYARD_DATABASE_URL and as --database-url.
A plain user submits a job whose model (tests/integration/runtime/spy_model.py) looks for
them everywhere it can: its environment, /proc of every meshyard process it can see, and
every file under the data dir. By hand, before: such a job printed the admin token, read
admin.token and meshyard.db, and listed the data dir. This machine runs everything as root,
so file modes stop nothing here: what keeps the job out is the Landlock confinement of the
embedded Ray, the scrubbed and allowlisted environment, and the masked /proc entries.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from api.client import MeshyardClient
from orchestrator.runtime.sandbox import landlock_abi
from tests.integration.runtime.conftest import serve_url, stop_serve

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.skipif(landlock_abi() < 1, reason="no Landlock on this kernel: the embedded Ray "
                    "then runs unconfined (the server logs it), and this test would fail")
def test_a_hostile_job_finds_no_secret(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token = "msy_seeded-" + secrets.token_urlsafe(24)
    db_url = f"sqlite:///{data / 'meshyard.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MESHYARD_"))}
    # Ray's temp dir does not exist yet (a fresh machine's /tmp/ray): Ray creates it beside
    # the path to the data dir after the confinement, which must still let Ray write there.
    ray_tmp = Path("/tmp") / f"meshyard-test-{secrets.token_hex(4)}"
    # Trusted mode: the job's model runs inside the worker actor, which isolated mode would
    # refuse to a plain user (tests/security/hostile/ covers isolated mode's confinement);
    # here the embedded Ray itself is confined out of the data dir.
    env.update(MESHYARD_ADMIN_TOKEN=token, MESHYARD_DATABASE_URL=db_url,
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_TMPDIR=str(ray_tmp),
               MESHYARD_ISOLATION="trusted")
    data.mkdir()
    # As left by an earlier first start (`admin.token`), next to the seeded token in the env.
    file_token = "msy_first-start-" + secrets.token_urlsafe(24)
    (data / "admin.token").write_text(file_token + "\n")
    log = open(data / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(Path(sys.executable).parent / "meshyard"), "serve", "--port",
                             "0", "--data-dir", str(data), "--database-url", db_url,
                             "--no-access-log"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=REPO)
    try:
        url = serve_url(data, proc, token=token, timeout_s=120)
        with MeshyardClient(url, token) as admin:
            alice = admin.create_token(user="alice").token
        spec = {"name": "spy", "resources": {"device": "cpu", "cpus_per_worker": 0.5},
                "model": {"kind": "import", "path": "tests.integration.runtime.spy_model:build",
                          "kwargs": {"data_dir": str(data)}},
                "training": {"steps": 2, "micro_batch_size": 2},
                "checkpoint": {"enabled": False}}
        with MeshyardClient(url, alice) as client:
            job = client.submit(spec)
            done = client.wait(job.id, timeout_s=240)
        assert done.state.value == "SUCCEEDED", (done, (data / "serve.log").read_text()
                                                 [-3000:])
        report_path = data / "runs" / job.id / "spy-rank0.json"
        text = report_path.read_text()
        report = json.loads(text)
    finally:
        stop_serve(proc, timeout_s=60)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    # Nothing anywhere in what the job could gather holds either secret.
    for secret in (token, file_token, db_url):
        assert secret not in text
    assert str(data / "meshyard.db") not in "".join(report["environ"].values())
    assert not [k for k in report["environ"] if k.startswith("MESHYARD_") and
                k not in ("MESHYARD_RUN_DIR", "MESHYARD_JOB_ID", "MESHYARD_ATTEMPT")]
    # The private files are listed (names are no secret) but none can be read.
    private = {name: report["data_dir"][str(data / name)]
               for name in ("meshyard.db", "admin.token", "server.json")}
    assert all(v.startswith("<PermissionError") for v in private.values()), private
    # The job's own run dir stays open to it.
    assert report["run_dir"] == str((data / "runs" / job.id).resolve())
    # The server's own /proc entries are visible to a root job, with the secrets masked.
    server_cmdlines = [v for k, v in report["proc"].items()
                       if k.endswith("/cmdline") and "serve" in v and "--database-url" in v]
    assert server_cmdlines, sorted(report["proc"])
