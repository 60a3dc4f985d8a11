"""Hang diagnoses over the API and the CLI against a real server, plus the fault-injection gate.

Reports are written straight into the server's database with the watchdog's own classes (the
controller path is covered by tests/integration/watchdog/test_runtime_hangs.py).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from orchestrator.watchdog.report import DiagnosisReport, RankReport, Verdict
from tests.integration.api.conftest import REPO, Server, run_cli

ON_SQLITE = pytest.mark.parametrize("server", ["sqlite"], indirect=True)
FIXTURES = REPO / "tests" / "fixtures"


def _report(verdict: Verdict, culprit: int, summary: str) -> DiagnosisReport:
    return DiagnosisReport(verdict=verdict, culprit_ranks=(culprit,), confidence=0.8,
                           summary=summary,
                           evidence=(RankReport(rank=culprit, state="not_joined", step=3),),
                           recommendations=("Check the collective order.",))


def _store_reports(server: Server, job_id: str) -> None:
    from orchestrator.store import open_store

    url = server.database_url or f"sqlite:///{server.data_dir / 'meshyard.db'}"
    store = open_store(url, migrate=False)
    try:
        for rep in (_report(Verdict.STRAGGLER, 2, "Rank 2 is a straggler, not a hang."),
                    _report(Verdict.NOT_JOINED, 1, "Rank 1 never entered all_reduce #7.")):
            store.add_diagnosis(job_id, 1, verdict=rep.verdict.value,
                                culprit_ranks=list(rep.culprit_ranks), summary=rep.summary,
                                report=rep.to_dict())
    finally:
        store.close()


@ON_SQLITE
def test_diagnoses_newest_first_and_cli_prints_markdown(server: Server) -> None:
    with server.client(server.admin_token) as http:
        job = http.post("/v1/jobs", json={"name": "diag-" + secrets.token_hex(3)}).json()
        _store_reports(server, job["id"])
        items = http.get(f"/v1/jobs/{job['id']}/diagnoses").json()["items"]
    assert [(d["verdict"], d["culprit_ranks"]) for d in items] == [
        ("NOT_JOINED", [1]), ("STRAGGLER", [2])]
    assert items[0]["confidence"] == pytest.approx(0.8)
    assert items[0]["evidence"][0]["rank"] == 1 and items[0]["summary"].startswith("Rank 1")

    out = run_cli("diagnosis", job["id"], data_dir=server.data_dir)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "Rank 1 never entered all_reduce #7."
    assert "**Verdict:** NOT_JOINED" in out.stdout and "straggler" not in out.stdout
    every = run_cli("diagnosis", job["id"], "--all", "--json", data_dir=server.data_dir)
    assert [d["verdict"] for d in json.loads(every.stdout)] == ["NOT_JOINED", "STRAGGLER"]


@ON_SQLITE
def test_diagnosis_of_a_job_without_reports_says_so(server: Server) -> None:
    with server.client(server.admin_token) as http:
        job = http.post("/v1/jobs", json={"name": "nodiag-" + secrets.token_hex(3)}).json()
    out = run_cli("diagnosis", job["id"], data_dir=server.data_dir)
    assert out.returncode == 1 and "no diagnosis" in out.stderr


def test_fault_injection_only_with_the_flag(tmp_path: Path) -> None:
    spec = {"name": "faulty", "inject_fault": {"kind": "hang", "rank": 0, "step": 2}}
    allowed = Server(data_dir=tmp_path / "on", extra_args=("--allow-fault-injection",)).start()
    try:
        with allowed.client(allowed.admin_token) as http:
            r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        assert r.json()["state"] == "QUEUED"
    finally:
        allowed.stop()
    plain = Server(data_dir=tmp_path / "off").start()
    try:
        with plain.client(plain.admin_token) as http:
            r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 422
        assert "--allow-fault-injection" in r.text
    finally:
        plain.stop()


def test_logs_parse_json_and_offline_diagnose(tmp_path: Path) -> None:
    out = run_cli("logs", "parse", str(FIXTURES / "logs" / "nccl_coll_allreduce_2rank_nccl203.log"),
                  "--json")
    assert out.returncode == 0, out.stderr
    events = json.loads(out.stdout)
    colls = [e for e in events if e["kind"] == "nccl_coll"]
    assert colls and colls[0]["op"] == "AllReduce" and isinstance(colls[0]["op_count"], int)
    assert colls[0]["nranks"] == 2

    fr = tmp_path / "fr"  # one job's dumps: rank 1 never entered all_reduce #4 (gloo)
    fr.mkdir()
    for r in (0, 1):
        name = f"gloo_torch2.13_notjoined_rank{r}.pkl"
        (fr / name).write_bytes((FIXTURES / "fr" / name).read_bytes())
    diag = run_cli("diagnose", "--fr", str(fr), "--json")
    assert diag.returncode == 0, diag.stderr
    rep = json.loads(diag.stdout)
    assert (rep["verdict"], rep["culprit_ranks"]) == ("NOT_JOINED", [1])
    md = run_cli("diagnose", "--fr", str(fr))
    assert md.stdout.splitlines()[0] == rep["summary"]
    missing = run_cli("diagnose")
    assert missing.returncode == 2


def test_logs_group_keeps_the_job_log_command() -> None:
    from typer.testing import CliRunner

    from api.cli import app

    for args in (["logs", "job-x", "--rank", "1"], ["logs", "--rank", "1", "job-x"]):
        r = CliRunner().invoke(app, [*args, "--url", "http://127.0.0.1:9", "--token", "t"])
        assert r.exit_code == 2 and "cannot reach the server" in r.output  # ran `logs show`
    assert "parse" in CliRunner().invoke(app, ["logs", "--help"]).output
