"""torchrun's failure summary as analyzer evidence (`meshyard diagnose --logs`): a rank that
exited is named as the cause of the others' wait, and its exit code and exception reach the
summary. Fixture: tests/fixtures/logs_realworld/diagnose_rank_exited/ (2 nodes, 4 ranks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from api.cli import app
from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.offline import build_offline_input, diagnose_offline
from orchestrator.watchdog.report import Verdict

JOB = Path(__file__).resolve().parents[2] / "fixtures" / "logs_realworld" / "diagnose_rank_exited"


def _without_summary(tmp_path: Path) -> Path:
    """The same logs with node-a's failure summary removed (its NCCL lines kept)."""
    d = tmp_path / "logs"
    d.mkdir()
    (d / "node-b.log").write_text((JOB / "node-b.log").read_text())
    keep = [ln for ln in (JOB / "node-a.log").read_text().splitlines() if " NCCL " in ln]
    (d / "node-a.log").write_text("\n".join(keep) + "\n")
    return d


def test_the_exited_rank_is_the_verdict() -> None:
    rep = diagnose_offline(logs_dir=JOB)
    assert rep.verdict is Verdict.RANK_EXITED
    assert rep.culprit_ranks == (1,)
    assert rep.summary == ("Rank 1 (node-a GPU 1) exited (exit code 1: RuntimeError: CUDA error: "
                           "an illegal memory access was encountered); 2 rank(s) are waiting "
                           "for it in all_reduce #88 on pg 0.")
    states = {r.rank: r.state for r in rep.evidence}
    assert states == {0: "unknown", 1: "exited", 2: "waiting", 3: "waiting"}
    assert "/tmp/torchelastic_3k1/none_q2x/attempt_0/1/error.json" in rep.artifacts


def test_without_the_summary_the_verdict_is_not_rank_exited(tmp_path: Path) -> None:
    rep = diagnose_offline(logs_dir=_without_summary(tmp_path))
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (0, 1)


def test_ranks_aborted_by_their_watchdog_stay_waiters() -> None:
    off = build_offline_input(logs_dir=JOB / "node-b.log")
    by_rank = {ev.rank: ev for ev in off.analysis.ranks}
    assert by_rank[2].alive is True and by_rank[2].pending[0].seq == 88
    assert any("aborted after its watchdog timeout (exit code -6 (SIGABRT))" in e
               for e in by_rank[2].log_errors)
    rep = analyze(off.analysis)
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.NOT_JOINED, (0, 1))


def test_exit_evidence_reaches_the_analyzer_input() -> None:
    off = build_offline_input(logs_dir=JOB)
    (r1,) = [ev for ev in off.analysis.ranks if ev.rank == 1]
    assert (r1.alive, r1.exit_info) == (False, "exit code 1: RuntimeError: CUDA error: an "
                                        "illegal memory access was encountered")
    assert r1.exit_time_s is not None
    assert off.analysis.world_size == 4
    assert off.analysis.locations[1].node == "node-a"


def test_cut_failure_summary_still_says_the_rank_exited(tmp_path: Path) -> None:
    text = (JOB / "node-a.log").read_text()
    cut = text[: text.index("  error_file:")]
    (tmp_path / "a.log").write_text(cut)
    (tmp_path / "b.log").write_text((JOB / "node-b.log").read_text())
    rep = diagnose_offline(logs_dir=tmp_path)
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.RANK_EXITED, (1,))
    assert "exit code 1" in rep.summary


def test_cli_diagnose_and_logs_parse_on_the_fixtures() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["diagnose", "--logs", str(JOB), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert (doc["verdict"], doc["culprit_ranks"]) == ("RANK_EXITED", [1])
    md = runner.invoke(app, ["diagnose", "--logs", str(JOB)])
    assert md.output.splitlines()[0] == doc["summary"]
    res = runner.invoke(app, ["logs", "parse", str(JOB / "node-a.log"), "--json"])
    assert res.exit_code == 0, res.output
    exits = [e for e in json.loads(res.output) if e["kind"] == "rank_exited"]
    assert [(e["rank"], e["exit_code"], e["root_cause"]) for e in exits] == [(1, 1, True)]
    text = runner.invoke(app, ["logs", "parse", str(JOB / "node-b.log")])
    assert len(re.findall(r"^rank_exited ", text.stdout, re.M)) == 2
