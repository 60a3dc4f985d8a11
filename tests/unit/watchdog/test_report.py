"""DiagnosisReport: JSON contract, round trip, Markdown rendering."""

from __future__ import annotations

import json

from orchestrator.watchdog.report import (
    DiagnosisReport,
    Mismatch,
    PgProgress,
    RankLocation,
    RankReport,
    SuspectHardware,
    Verdict,
)


def sample() -> DiagnosisReport:
    loc = RankLocation(node="node-b", gpu=1, labels={"leaf": "l0"}, mesh={"tp": 1})
    return DiagnosisReport(
        verdict=Verdict.NOT_JOINED, culprit_ranks=(5, 5), confidence=1.7,
        summary="Rank 5 (node-b GPU 1, tp 1) never entered all_reduce #1042 on pg 1 (dp); "
                "the other 7 ranks are waiting in it.",
        evidence=(RankReport(rank=5, state="not_joined", step=12,
                             pgs=(PgProgress(pg="1", last_enqueued=1041, last_completed=1041),),
                             top_of_stack="load at data.py:9", location=loc, has_trace=True,
                             nccl_errors=("a|b",)),),
        mismatches=(Mismatch(pg="1", seq=3, field="sizes", expected="x", actual={2: "y"}),),
        suspect_hardware=(SuspectHardware(level="leaf", name="l0", ranks=(4, 5), reason="r"),),
        recommendations=("one", "two"), artifacts=("/runs/1/diagnostics/x",),
        details={"pg": "1"})


def test_contract_keys_and_normalisation() -> None:
    d = json.loads(sample().to_json())
    assert d["verdict"] == "NOT_JOINED"
    assert d["culprit_ranks"] == [5]  # deduplicated, ints
    assert d["confidence"] == 1.0  # clamped
    assert d["summary"].startswith("Rank 5 (node-b GPU 1")
    assert d["evidence"][0]["pgs"][0] == {"pg": "1", "name": None, "last_enqueued": 1041,
                                          "last_completed": 1041, "pending_op": None,
                                          "missing_op": None, "pending": False}
    assert d["mismatches"][0]["actual"] == {"2": "y"} and d["mismatches"][0]["ranks"] == [2]


def test_round_trip() -> None:
    rep = sample()
    again = DiagnosisReport.from_dict(json.loads(rep.to_json()))
    assert again == rep
    assert again.evidence[0].location.describe() == "node-b GPU 1, tp 1"


def test_markdown_first_line_is_the_summary() -> None:
    md = sample().to_markdown()
    lines = md.splitlines()
    assert lines[0] == sample().summary
    assert "**Verdict:** NOT_JOINED" in md
    assert "1. one" in md and "- leaf `l0` (ranks 4, 5): r" in md
    assert "| 5 | not_joined | 12 | node-b GPU 1, tp 1 | 1:1041/1041 | load at data.py:9 | a\\|b |" \
        in md


def test_minimal_report() -> None:
    rep = DiagnosisReport.from_dict({"verdict": "UNKNOWN"})
    assert rep.culprit_ranks == () and rep.to_markdown().startswith("\n") is False
