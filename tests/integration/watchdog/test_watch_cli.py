"""`meshyard watch -- torchrun ...` on the user script of test_user_hangs (plain torch, gloo):
the probe loads in every rank through the launcher's PYTHONPATH, the report is printed and
written with the evidence directory, and `meshyard diagnose` reads that directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.host.env import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).resolve().parent / "user_scripts" / "hangs.py"
REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-c", "from api.cli import main; main()"]
SAVE_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
                 if "time.sleep(600)" in line)


def _watch(out: Path, *args: str, timeout: float = 150) -> tuple[subprocess.CompletedProcess,
                                                                 float]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                f"--master_port={free_port()}", str(SCRIPT), *args]
    t0 = time.monotonic()
    res = subprocess.run([*CLI, "watch", "--out", str(out), "--stall-timeout", "3", "--",
                          *torchrun], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return res, time.monotonic() - t0


def test_watch_names_rank_0_that_never_joined_and_diagnose_reads_the_evidence(tmp_path):
    out = tmp_path / "ev"
    res, took = _watch(out, "not_joined", "0")
    print(f"\n[watch] not_joined: exit {res.returncode} after {took:.1f} s")
    assert res.returncode == 3, res.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert (report["verdict"], report["culprit_ranks"]) == ("NOT_JOINED", [0])
    assert f"hangs.py:{SAVE_LINE} in save_checkpoint()" in report["summary"]
    assert report["summary"].splitlines()[0] in res.stderr  # printed, first line to act on
    assert sorted(p.name for p in (out / "fr").iterdir()) == ["rank_0", "rank_1"]
    assert "reached the fault" in (out / "logs" / "launcher.log").read_text()
    offline = subprocess.run([*CLI, "diagnose", "--fr", str(out / "fr"), "--logs",
                              str(out / "logs"), "--json"], capture_output=True, text=True,
                             timeout=60, cwd=REPO)
    assert offline.returncode == 0, offline.stderr
    again = json.loads(offline.stdout)
    assert (again["verdict"], again["culprit_ranks"]) == ("NOT_JOINED", [0])


def test_watch_names_the_rank_that_returned_early(tmp_path):
    out = tmp_path / "ev"
    res, _ = _watch(out, "exited", "1")
    # 3 when watch ended the job; torchrun's own 1 when rank 0's "Connection closed" error
    # ended it first (the report then comes from the last look at the ranks' exits).
    assert res.returncode in (1, 3), res.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "RANK_EXITED" and 1 in report["culprit_ranks"]


@pytest.mark.parametrize("scenario,verdicts,culprits", [
    ("p2p", {"P2P_MISMATCH"}, [0]),
    ("non_collective", {"NON_COLLECTIVE_HANG"}, [0, 1]),
    # gloo aborts the receiving rank 0 (SIGABRT); rank 1 then raises "Connection reset".
    ("mismatch", {"RANK_EXITED", "COLLECTIVE_MISMATCH"}, [0]),
])
def test_watch_scenarios(tmp_path, scenario, verdicts, culprits):
    out = tmp_path / "ev"
    res, took = _watch(out, scenario, "1" if scenario == "mismatch" else "0")
    assert (out / "report.json").exists(), res.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    print(f"\n[watch] {scenario}: {report['verdict']} {report['culprit_ranks']} in {took:.1f} s"
          f" | {report['summary']}")
    assert res.returncode in ((3, -6, 1) if scenario == "mismatch" else (3,)), res.returncode
    assert report["verdict"] in verdicts and report["culprit_ranks"] == culprits
    if scenario != "mismatch":
        assert "hangs.py:" in report["summary"] or "hangs.py:" in str(report["evidence"])


def test_watch_passes_a_healthy_job_through(tmp_path):
    out = tmp_path / "ev"
    res, _ = _watch(out, "healthy", "0", "--steps", "30")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not (out / "report.json").exists()
    assert sorted(p.name for p in (out / "probe").glob("*.progress.json")) == [
        "rank0.progress.json", "rank1.progress.json"]
