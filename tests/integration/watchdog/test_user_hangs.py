"""Hangs in a user's own script (tests/integration/watchdog/user_scripts/hangs.py: plain
torch.distributed on gloo, nothing of meshyard) through the service: REST upload and submit,
the runtime on a local Ray, the probe inside every rank process, the watchdog's stall rule on
collective seqs (the script reports no step), the stored report read back over REST.

One runtime and one in-process app serve the module, on the package's Ray (conftest.py).
`watchdog.stall_timeout_s` is 3 s and `action: fail`, so a hung job ends as soon as its report
is stored; each test asserts the report was stored within 30 s of the moment the script
reached its fault (it prints the time on stdout). The tests run one job at a time: run side
by side, the jobs miss the warm pool and Ray starts more worker processes, which costs more
CPU than the overlapped waits save.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from fastapi.testclient import TestClient  # noqa: E402

from api.packaging import build_package  # noqa: E402
from tests.support.evidence import (  # noqa: E402
    assert_hang_round_with_native,
    assert_probe_without_native,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
REPORT_WITHIN_S = 30.0


def _line_of(text: str) -> int:
    """The line of hangs.py holding `text` (the reports name the user's file:line)."""
    lines = (SCRIPTS / "hangs.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


SAVE_LINE = _line_of("time.sleep(600)")
DATA_LINE = _line_of("time.sleep(0.05)")


class Service:
    def __init__(self, client: TestClient, auth: dict[str, str], package: str,
                 runs: Path) -> None:
        self.client, self.auth, self.package, self.runs = client, auth, package, runs

    def submit(self, scenario: str, culprit: int, *, world: int = 3, steps: int | None = None,
               max_failures: int = 0, **watchdog: Any) -> str:
        cmd = ["python", "hangs.py", scenario, str(culprit)]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        spec = {"name": f"user-{scenario}-{culprit}", "parallelism": {"dp_replicate": world},
                "resources": {"cpus_per_worker": 0.25, "device": "cpu"},
                # 180 s before the first step: three ranks importing torch on a loaded host
                # took over 60 s (and were rightly reported blocked at `import torch`)
                "fault_tolerance": {"max_failures": max_failures, "init_timeout_s": 180,
                                    "collective_timeout_s": 60},
                "entrypoint": {"command": cmd, "working_dir": self.package},
                "watchdog": {"stall_timeout_s": 3, "first_step_timeout_s": 180,
                             "action": "fail", **watchdog}}
        r = self.client.post("/v1/jobs", json=spec, headers=self.auth)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.client.get(f"/v1/jobs/{job_id}", headers=self.auth).json())

    def wait_terminal(self, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return job
            time.sleep(0.3)
        raise AssertionError(f"{job_id} never ended: {self.job(job_id)}")

    def reports(self, job_id: str) -> list[dict[str, Any]]:
        r = self.client.get(f"/v1/jobs/{job_id}/diagnoses", headers=self.auth)
        assert r.status_code == 200, r.text
        return list(r.json()["items"])

    def events(self, job_id: str) -> list[dict[str, Any]]:
        r = self.client.get(f"/v1/jobs/{job_id}/events", headers=self.auth)
        assert r.status_code == 200, r.text
        body = r.json()
        return list(body["items"] if isinstance(body, dict) else body)


@pytest.fixture(scope="module")
def service(ray_connected: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from api.app import create_app
    from api.server import prepare
    from orchestrator.runtime.service import Runtime
    from orchestrator.settings import Settings

    tmp = tmp_path_factory.mktemp("user-hangs")
    settings = Settings(data_dir=tmp / "data")
    prepared = prepare(settings)
    rt = Runtime(settings, prepared.store, tick_s=0.2, warm_pool=3)
    auth = {"Authorization": f"Bearer {prepared.admin_token}"}
    try:
        with TestClient(create_app(settings, store=prepared.store, runtime=rt),
                        base_url="http://127.0.0.1") as client:
            pkg = build_package(SCRIPTS, max_bytes=settings.max_package_bytes)
            up = client.post("/v1/packages", content=pkg.data,
                             headers={**auth, "Content-Type": "application/zip"})
            assert up.status_code in (200, 201), up.text
            yield Service(client, auth, str(up.json()["package"]), settings.resolved_runs_dir)
    finally:
        prepared.store.close()


def _hang_report(svc: Service, job_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    job = svc.wait_terminal(job_id)
    reports = svc.reports(job_id)
    assert reports, (job, svc.events(job_id)[-8:])
    rep = reports[-1]  # the first: what ended the job
    for r in reports:
        print(f"\n[user-hang] {r['verdict']} {r['culprit_ranks']} | {r['summary']}")
    if os.environ.get("HANG_DEBUG"):
        for e in svc.events(job_id):
            print(" ", e.get("at"), e.get("kind"), e.get("dst"), e.get("reason"),
                  str(e.get("message"))[:300])
    return job, rep


def _within_bound(svc: Service, job_id: str, rep: dict[str, Any]) -> None:
    """The report was stored within REPORT_WITHIN_S of the first rank of the reported
    attempt reaching the fault."""
    from datetime import datetime

    logs = (svc.runs / job_id / "logs" / f"attempt-{rep['attempt']}").glob("rank-*.stdout")
    marks = [float(m.group(1)) for p in logs
             for m in re.finditer(r"reached the fault at ([0-9.]+)", p.read_text())]
    assert marks, "no rank printed its fault time"
    took = datetime.fromisoformat(str(rep["created_at"])).timestamp() - min(marks)
    print(f"[user-hang] fault -> stored report {took:.1f} s "
          f"({rep['report']['details'].get('detection')})")
    assert 0 < took < REPORT_WITHIN_S


def _evidence(rep: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(e for e in rep["evidence"] if e["rank"] == rank)


@pytest.mark.parametrize("culprit", [2, 0])
def test_rank_that_sleeps_before_all_reduce_is_not_joined_with_its_line(service, culprit):
    job_id = service.submit("not_joined", culprit)
    job, rep = _hang_report(service, job_id)
    assert job["state"] == "FAILED" and job["failure_reason"] == "HANG_DETECTED"
    assert (rep["verdict"], rep["culprit_ranks"]) == ("NOT_JOINED", [culprit])
    assert f"hangs.py:{SAVE_LINE} in save_checkpoint(): `time.sleep(600)" in rep["summary"]
    assert "never entered all_reduce #7 on pg 0" in rep["summary"]
    ev = _evidence(rep, culprit)
    assert ev["location"]["node"] and ev["top_of_stack"].startswith(f"hangs.py:{SAVE_LINE}")
    waiting = [e for e in rep["evidence"] if e["rank"] != culprit]
    assert all(e["state"] == "waiting" and "dist.all_reduce(t)" in e["top_of_stack"]
               for e in waiting)
    assert "collectives" in rep["report"]["details"]["detection"]
    _within_bound(service, job_id, rep)
    assert_hang_round_with_native(service.runs / job_id, [0, 1, 2])


def test_rank_that_returns_early_is_rank_exited(service):
    job_id = service.submit("exited", 1)
    job, rep = _hang_report(service, job_id)
    assert (rep["verdict"], rep["culprit_ranks"]) == ("RANK_EXITED", [1])
    assert "exit code 0" in rep["summary"]
    # The job's message leads with the rank that left, not with its peers' errors (gloo's
    # "Connection closed by peer", when they raise before the stall rule fires).
    assert "Rank 1 (" in job["message"].split("exited")[0]
    _within_bound(service, job_id, rep)


def test_size_mismatch_that_gloo_aborts_names_a_dead_rank(service):
    job_id = service.submit("mismatch", 1, world=2)
    _, rep = _hang_report(service, job_id)
    # gloo aborts the receiving rank ("100 vs 16 ... collective mismatch") before any probe
    # can see the call: the first death is the evidence.
    assert rep["verdict"] in ("COLLECTIVE_MISMATCH", "RANK_EXITED")
    assert rep["culprit_ranks"] and set(rep["culprit_ranks"]) <= {0, 1}
    assert "100 vs 16" in rep["summary"]  # gloo's abort message, from the rank's stderr
    _within_bound(service, job_id, rep)


def test_pipeline_stage_that_never_sends_is_p2p_mismatch(service):
    job_id = service.submit("p2p", 1)
    _, rep = _hang_report(service, job_id)
    assert (rep["verdict"], rep["culprit_ranks"]) == ("P2P_MISMATCH", [1])
    assert f"hangs.py:{SAVE_LINE} in save_checkpoint()" in rep["summary"]
    _within_bound(service, job_id, rep)


def test_every_rank_in_a_python_loop_is_non_collective_with_each_line(service):
    job_id = service.submit("non_collective", 0, world=2)
    _, rep = _hang_report(service, job_id)
    assert (rep["verdict"], rep["culprit_ranks"]) == ("NON_COLLECTIVE_HANG", [0, 1])
    assert f"hangs.py:{DATA_LINE} in wait_for_data()" in rep["summary"]
    assert all("wait_for_data" in e["top_of_stack"] for e in rep["evidence"])
    _within_bound(service, job_id, rep)


def test_slow_rank_is_a_straggler_and_the_job_succeeds(service):
    # a stall threshold far above the culprit's 0.15 s steps: this scenario is a rank that is
    # slow, not one that the host's load pauses past the module's 3 s
    job_id = service.submit("straggler", 1, steps=120, stall_timeout_s=30)
    job = service.wait_terminal(job_id)
    assert job["state"] == "SUCCEEDED", (job["failure_reason"], job["message"])
    reports = service.reports(job_id)
    assert [(r["verdict"], r["culprit_ranks"]) for r in reports] == [("STRAGGLER", [1])]
    print(f"\n[user-hang] {reports[0]['verdict']} | {reports[0]['summary']}")
    assert_probe_without_native(service.runs / job_id, world=3)


def test_a_restarted_attempt_gets_the_first_step_allowance(service):
    """`action: restart` after a hang: the new attempt starts slowly (8 s before its first
    collective, past the 3 s stall threshold) and must be held to the first-step threshold,
    as the first attempt was, not to the old attempt's progress."""
    job_id = service.submit("hang_once", 1, steps=40, max_failures=1, action="restart",
                            first_step_timeout_s=60)
    spec_ok = service.client.get(f"/v1/jobs/{job_id}", headers=service.auth).json()
    assert spec_ok["spec"]["watchdog"]["action"] == "restart"
    job = service.wait_terminal(job_id, timeout_s=240)
    attempts = service.client.get(f"/v1/jobs/{job_id}/attempts", headers=service.auth).json()
    states = [a["state"] for a in attempts["items"]]
    assert job["state"] == "SUCCEEDED", (job["failure_reason"], job["message"], states)
    assert states == ["FAILED", "SUCCEEDED"], states
    assert [r["attempt"] for r in service.reports(job_id)] == [1]  # none on the restart


def test_healthy_script_gets_no_report(service):
    job_id = service.submit("healthy", 0, steps=60)
    job = service.wait_terminal(job_id)
    assert job["state"] == "SUCCEEDED", (job["failure_reason"], job["message"])
    assert service.reports(job_id) == []


def test_stacks_now_come_from_inside_the_rank_processes(service):
    """"Stacks now" on a user-code job: the probe in each rank process answers (the worker
    actor's own threads would say nothing about the script)."""
    job_id = service.submit("non_collective", 0, world=2, stall_timeout_s=120,
                            first_step_timeout_s=120, action="observe")
    deadline = time.monotonic() + 120
    out = service.runs / job_id / "logs" / "attempt-1"
    while not all("reached the fault" in (p.read_text() if p.exists() else "")
                  for p in (out / "rank-0.stdout", out / "rank-1.stdout")):
        assert time.monotonic() < deadline, service.job(job_id)
        time.sleep(0.3)
    asked = service.client.post(f"/v1/jobs/{job_id}/stacks", headers=service.auth)
    assert asked.status_code == 202, asked.text
    url = asked.headers["Location"]
    while (got := service.client.get(url, headers=service.auth).json())["state"] not in (
            "done", "failed"):
        assert time.monotonic() < deadline, got
        time.sleep(0.3)
    service.client.post(f"/v1/jobs/{job_id}/cancel", headers=service.auth)
    assert got["state"] == "done" and got["ranks_answered"] == 2, got
    training = [g for g in got["groups"] if g["training"]]
    assert training and training[0]["ranks"] == [0, 1]
    assert "in wait_for_data" in training[0]["stack"] and "hangs.py" in training[0]["stack"]
    assert service.reports(job_id) == []
    assert service.wait_terminal(job_id)["state"] == "CANCELLED"
