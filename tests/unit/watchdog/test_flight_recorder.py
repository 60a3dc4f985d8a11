"""Flight Recorder normalisation: the tutorial's v2.5 NCCL dump, real torch 2.13 gloo dumps,
and malformed / older inputs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.flight_recorder import load_dump, parse_dump, parse_entry
from orchestrator.watchdog.inputs import AnalysisInput, RankEvidence
from orchestrator.watchdog.report import Verdict

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def tutorial_dump() -> dict:
    """The tutorial prints the unpickled dict in JSON-ish form with '...' elisions."""
    text = (FIX / "logs" / "torch_fr_dump_unpickled_tutorial_v2.5.txt").read_text()
    body = "\n".join(ln for ln in text.splitlines()
                     if not ln.startswith("#") and ln.strip() not in ("...", "...,"))
    for word, py in (("null", "None"), ("true", "True"), ("false", "False")):
        body = re.sub(rf"\b{word}\b", py, body)
    return ast.literal_eval(body.strip())


def test_tutorial_v25_nccl_dump() -> None:
    tr = parse_dump(tutorial_dump(), rank=0)
    assert tr.version == "2.5"
    assert tr.pg_config["0"].ranks == (0, 1) and tr.pg_config["0"].desc == "default_pg"
    (e,) = tr.entries
    assert (e.backend, e.op, e.pg, e.pg_desc) == ("nccl", "all_reduce", "0", "default_pg")
    assert (e.collective_seq, e.p2p_seq, e.is_p2p, e.completed) == (1, 0, False, True)
    assert e.input_sizes == ((3, 4),) and e.input_dtypes == ("Float",)
    assert e.frames[0] == "test_short_pickle at pytorch/test/distributed/test_c10d_nccl.py:3647"
    assert tr.last_enqueued("0") == 1  # entries win over pg_status (which says 2: elided)
    assert tr.last_completed("0") == 1


def test_real_gloo_dumps_from_torch_2_13() -> None:
    r0 = load_dump(FIX / "fr" / "gloo_torch2.13_notjoined_rank0.pkl")
    r1 = load_dump(FIX / "fr" / "gloo_torch2.13_notjoined_rank1.pkl")
    assert (r0.rank, r1.rank) == (0, 1)  # from the file name
    assert r0.version == "2.10" and r0.pg_config == {}  # gloo leaves pg_config empty
    assert (r0.last_enqueued("0"), r0.last_completed("0")) == (4, 3)
    assert (r1.last_enqueued("0"), r1.last_completed("0")) == (3, 3)
    assert [e.label() for e in r0.pending("0")] == ["all_reduce #4"]
    assert r1.pending("0") == []
    sub = r0.collectives("1")[1]
    assert (sub.input_dtypes, sub.input_sizes, sub.completed) == (("BFloat16",), ((8,),), True)
    # gloo never sets state "completed": completion comes from `retired`.
    assert {e.state for e in r0.entries} == {"scheduled"}
    assert r0.entries[0].frames[0].startswith("all_reduce at ")


def test_real_gloo_dumps_analyze_to_not_joined_rank1() -> None:
    ranks = tuple(RankEvidence(rank=r, trace=load_dump(
        FIX / "fr" / f"gloo_torch2.13_notjoined_rank{r}.pkl")) for r in (0, 1))
    rep = analyze(AnalysisInput(ranks=ranks, world_size=2, pg_members={"1": (0, 1)}))
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (1,)


def test_missing_keys_and_garbage_are_tolerated() -> None:
    tr = parse_dump({"entries": [{}, "junk", {"profiling_name": "nccl:broadcast",
                                               "collective_seq_id": "7", "input_sizes": "x"}],
                     "pg_status": {"0": "junk"}, "pg_config": None})
    assert len(tr.entries) == 2
    assert tr.entries[0].op == "?" and tr.entries[0].pg == "0"
    assert tr.entries[1].collective_seq == 7 and tr.entries[1].input_sizes == ()
    assert parse_dump({}).entries == ()


def test_older_versions_nccl_version_key_and_p2p_names() -> None:
    tr = parse_dump({"version": "2.2", "nccl_version": "2.18.1", "entries": [
        {"pg_id": 3, "profiling_name": "nccl:send 0->1", "p2p_seq_id": 5, "state": "started"},
        {"process_group": ["3", "pp"], "profiling_name": "nccl:recv 0<-1", "is_p2p": True,
         "state": "scheduled"}]})
    assert tr.comm_lib_version == "2.18.1"
    send, recv = tr.entries
    assert (send.op, send.peer, send.is_p2p, send.pg, send.completed) == ("send", 1, True, "3",
                                                                          False)
    assert (recv.op, recv.peer, recv.pg_desc) == ("recv", 1, "pp")
    assert [e.op for e in tr.pending("3")] == ["send", "recv"]


def test_entry_without_backend_prefix() -> None:
    e = parse_entry({"profiling_name": "all_gather", "collective_seq_id": 2})
    assert (e.backend, e.op) == ("", "all_gather")


def test_gloo_pg_status_counts_p2p_so_entries_win() -> None:
    # Real dump: all_reduce x2, send/recv, all_reduce, then rank 0 blocks in all_reduce #4.
    r0 = load_dump(FIX / "fr" / "gloo_torch2.13_p2p_rank0.pkl")
    assert (r0.pg_status["0"].last_enqueued, r0.pg_status["0"].last_completed) == (5, 4)
    assert (r0.last_enqueued("0"), r0.last_completed("0")) == (4, 3)
    assert [e.label() for e in r0.pending("0")] == ["all_reduce #4"]
    r1 = load_dump(FIX / "fr" / "gloo_torch2.13_p2p_rank1.pkl")
    rep = analyze(AnalysisInput(ranks=(RankEvidence(rank=0, trace=r0),
                                       RankEvidence(rank=1, trace=r1)), world_size=2))
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.NOT_JOINED, (1,))


def test_status_only_when_entries_were_evicted() -> None:
    tr = parse_dump({"pg_status": {"0": {"last_enqueued_collective": 9,
                                         "last_completed_collective": 8}}})
    assert (tr.last_enqueued("0"), tr.last_completed("0")) == (9, 8)
    pending_only = parse_dump({"entries": [{"collective_seq_id": 5, "retired": False}]})
    assert pending_only.last_completed("0") == 4
