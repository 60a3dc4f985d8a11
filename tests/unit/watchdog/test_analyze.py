"""Table tests for the pure analyzer on synthetic traces (every verdict class)."""

from __future__ import annotations

import time

import pytest

from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.flight_recorder import parse_dump
from orchestrator.watchdog.inputs import AnalysisInput, PendingOp, RankEvidence, analysis_input
from orchestrator.watchdog.report import DiagnosisReport, RankLocation, Verdict
from tests.unit.watchdog.synth import Job, Op, evidence, simulate, tp_dp_groups


def world_job(world: int, n_ops: int = 6, **kw) -> Job:
    return Job(world=world, groups={"0": tuple(range(world))},
               program=[Op("0") for _ in range(n_ops)], **kw)


@pytest.mark.parametrize("world", [2, 4, 8, 64])
@pytest.mark.parametrize("culprit_pos", ["first", "middle", "last"])
def test_not_joined_names_the_rank_that_never_entered(world: int, culprit_pos: str) -> None:
    culprit = {"first": 0, "middle": world // 2, "last": world - 1}[culprit_pos]
    rep = analyze(evidence(world_job(world, stop_before={culprit: 3})))
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (culprit,)
    assert "never entered all_reduce #4 on pg 0" in rep.summary
    assert rep.summary.startswith(f"Rank {culprit} ")
    assert rep.evidence[culprit].state == "not_joined"
    others = [e for e in rep.evidence if e.rank != culprit]
    assert all(e.state == "waiting" for e in others)


def test_rank0_culprit_is_named_although_pytorch_would_blame_the_others() -> None:
    # Rank 0 is the one that diverged; a first-rank reference would name ranks 1..3.
    rep = analyze(evidence(world_job(4, stop_before={0: 2})))
    assert rep.culprit_ranks == (0,)
    assert rep.confidence > 0.8


def test_extra_collective_on_a_minority_names_the_caller() -> None:
    # Rank 0 issues one more all_reduce; ranks 1..7 finished the program and idle.
    job = Job(world=8, groups={"0": tuple(range(8))}, program=[Op("0")] * 4,
              stop_before={r: 3 for r in range(1, 8)})
    rep = analyze(evidence(job))
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (0,)
    assert "extra collective" in rep.summary


@pytest.mark.parametrize("culprit", [0, 5])
def test_multi_pg_cascade_blames_the_root_not_the_blocked_peers(culprit: int) -> None:
    # 8 ranks, tp=2: step = TP all_gather then DP all_reduce, three steps.
    groups = tp_dp_groups(8, 2)
    tp_of = {r: next(g for g, m in groups.items() if g != "0" and len(m) == 2 and r in m)
             for r in range(8)}
    dp_of = {r: next(g for g, m in groups.items() if len(m) == 4 and r in m) for r in range(8)}
    program = []
    for _ in range(3):
        program += [Op(tp_of[r], "all_gather") for r in range(0, 8, 2)]
        program += [Op(dp_of[r], "all_reduce", ((128,),)) for r in range(2)]
    job = Job(world=8, groups=groups, program=program, stop_before={culprit: 8})
    rep = analyze(evidence(job))
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (culprit,)


def test_rank_exited() -> None:
    rep = analyze(evidence(world_job(4, stop_before={2: 3}), dead={2: "exit code -9"}))
    assert rep.verdict is Verdict.RANK_EXITED
    assert rep.culprit_ranks == (2,)
    assert "exit code -9" in rep.summary
    assert rep.evidence[2].state == "exited"


def test_exited_first_rank_is_the_cause_when_peers_died_after_it() -> None:
    inp = evidence(world_job(3, stop_before={1: 3}))
    ranks = tuple(RankEvidence(rank=e.rank, trace=e.trace, alive=e.rank == 0 or False,
                               exit_time_s={1: 100.0, 2: 130.0}.get(e.rank))
                  for e in inp.ranks)
    rep = analyze(AnalysisInput(ranks=ranks, world_size=3))
    assert rep.verdict is Verdict.RANK_EXITED
    assert rep.culprit_ranks == (1,)


GLOO_TIMEOUT = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                "Timed out waiting 10000ms for recv operation to complete")


@pytest.mark.parametrize("world,culprit", [(3, 1), (4, 0), (8, 7)])
def test_ranks_whose_collective_timed_out_are_not_blamed_for_the_rank_they_waited_for(
        world: int, culprit: int) -> None:
    # The diagnosis came after the collective timeout: the waiting ranks have exited, their
    # errors say a peer stopped answering; the rank that never joined still runs.
    job = world_job(world, stop_before={culprit: 3})
    waited = [r for r in range(world) if r != culprit]
    rep = analyze(evidence(job, dead={r: GLOO_TIMEOUT for r in waited}))
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.NOT_JOINED, (culprit,))
    assert rep.summary.startswith(f"Rank {culprit} never entered all_reduce #4 on pg 0")
    assert "since exited (RuntimeError: " in rep.summary and "Timed out waiting" in rep.summary
    assert rep.evidence[culprit].state == "not_joined"
    assert all(rep.evidence[r].state == "exited" for r in waited)


def test_timed_out_ranks_known_by_their_announced_op_only_are_not_blamed() -> None:
    # In the runtime a dead rank answers no diagnostics call: what is left of it is the op it
    # announced before the call (read on its node) and its error.
    inp = evidence(world_job(3, stop_before={1: 3}))
    ranks = tuple(ev if ev.rank == 1 else RankEvidence(
        rank=ev.rank, alive=False, exit_info=GLOO_TIMEOUT,
        pending=(PendingOp(op="all_reduce", pg="0", seq=4, source="announce"),))
        for ev in inp.ranks)
    rep = analyze(AnalysisInput(ranks=ranks, world_size=3, pg_members=inp.pg_members))
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.NOT_JOINED, (1,)), rep.summary
    assert "ranks 0, 2 have since exited" in rep.summary


def test_a_rank_that_exited_of_its_own_fault_is_still_the_culprit() -> None:
    # One waiting rank lost its peer, another crashed by itself: the crash is the cause.
    job = world_job(4, stop_before={1: 3})
    rep = analyze(evidence(job, dead={0: GLOO_TIMEOUT, 2: "exit code -9"}))
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.RANK_EXITED, (2,))
    # every rank gone, each losing a peer: nobody alive to blame, the exits are the finding
    rep = analyze(evidence(job, dead={r: GLOO_TIMEOUT for r in range(4)}))
    assert rep.verdict is Verdict.RANK_EXITED


@pytest.mark.parametrize("world,culprit", [(4, 0), (4, 3), (8, 6)])
def test_size_mismatch_majority_reference(world: int, culprit: int) -> None:
    job = world_job(world, replace={(culprit, 2): Op("0", sizes=((99,),))})
    rep = analyze(evidence(job))
    assert rep.verdict is Verdict.COLLECTIVE_MISMATCH
    assert rep.culprit_ranks == (culprit,)
    (m,) = rep.mismatches
    assert (m.seq, m.field) == (3, "sizes")
    assert m.expected == "all_reduce([[4, 4]], float)"
    assert m.actual == {culprit: "all_reduce([[99]], float)"}


def test_op_and_dtype_mismatch_fields() -> None:
    rep = analyze(evidence(world_job(4, replace={(1, 1): Op("0", op="broadcast")})))
    assert rep.mismatches[0].field == "op" and rep.culprit_ranks == (1,)
    rep = analyze(evidence(world_job(4, replace={(2, 1): Op("0", dtype="BFloat16")})))
    assert rep.mismatches[0].field == "dtypes" and rep.culprit_ranks == (2,)


def test_desync_skipped_collective_is_mismatch_or_not_joined_on_the_skipper() -> None:
    program = [Op("0", "all_reduce"), Op("0", "broadcast", ((8,),)), Op("0", "all_reduce")]
    job = Job(world=4, groups={"0": (0, 1, 2, 3)}, program=program * 2, skip={3: 1})
    rep = analyze(evidence(job))
    assert rep.verdict in (Verdict.COLLECTIVE_MISMATCH, Verdict.NOT_JOINED)
    assert rep.culprit_ranks == (3,)


def test_announced_op_of_an_aborted_rank_shows_the_mismatch() -> None:
    # gloo SIGABRTs on a size mismatch: rank 1 left only its pre-call announcement.
    inp = evidence(world_job(3, stop_before={0: 2, 1: 2, 2: 2}))
    ann = {r: PendingOp(op="all_reduce", pg="0", seq=3, sizes=((100,) if r == 1 else (12,),),
                        dtypes=("torch.float32",), source="announce") for r in range(3)}
    ranks = tuple(RankEvidence(rank=e.rank, trace=e.trace, alive=e.rank != 1,
                               pending=(ann[e.rank],)) for e in inp.ranks)
    rep = analyze(AnalysisInput(ranks=ranks, world_size=3))
    assert rep.verdict is Verdict.COLLECTIVE_MISMATCH
    assert rep.culprit_ranks == (1,)


def test_p2p_send_without_recv() -> None:
    # PP stages 0 -> 1 -> 2 -> 3; stage 1 never sends to stage 2.
    ranks = [RankEvidence(rank=0, trace=None, top_of_stack="train_step at pp.py:10",
                          stack="x"),
             RankEvidence(rank=1, trace=None, top_of_stack="forward at model.py:3", stack="x"),
             RankEvidence(rank=2, pending=(PendingOp(op="recv", is_p2p=True, peer=1),)),
             RankEvidence(rank=3, pending=(PendingOp(op="recv", is_p2p=True, peer=2),))]
    rep = analyze(AnalysisInput(ranks=tuple(ranks), world_size=4))
    assert rep.verdict is Verdict.P2P_MISMATCH
    assert rep.culprit_ranks == (1,)
    assert rep.summary.startswith("Rank 1 never posted the matching send/recv")


def test_nccl_p2p_entries_map_group_peer_to_global_rank() -> None:
    # PP group pg 1 = global ranks (4, 6); rank 6 waits in "recv 1<-0" = from global rank 4.
    recv = {"pg_id": 1, "process_group": ("1", "pp"), "collective_seq_id": 0,
            "p2p_seq_id": 3, "profiling_name": "nccl:recv 1<-0", "input_sizes": [[8]],
            "input_dtypes": ["Float"], "state": "started", "retired": False, "is_p2p": True}
    tr6 = parse_dump({"entries": [recv]}, rank=6)
    tr4 = parse_dump({"entries": []}, rank=4)
    ranks = [RankEvidence(rank=r, trace=tr6 if r == 6 else tr4 if r == 4 else None,
                          stack="idle") for r in range(8)]
    rep = analyze(AnalysisInput(ranks=tuple(ranks), world_size=8, pg_members={"1": (4, 6)}))
    assert rep.verdict is Verdict.P2P_MISMATCH
    assert rep.culprit_ranks == (4,)


def _wedged_input(stuck_pairs: list[tuple[int, int]]) -> AnalysisInput:
    # 4 nodes x 2 GPUs; n0,n1 under leaf l0, n2,n3 under leaf l1. Groups over node pairs.
    loc = {r: RankLocation(node=f"n{r // 2}", gpu=r % 2,
                           labels={"leaf": "l0" if r < 4 else "l1", "spine": "s0"})
           for r in range(8)}
    pairs = {"1": (0, 2), "2": (4, 6), "3": (1, 5), "4": (3, 7), "5": (0, 1)}
    ranks = []
    for r in range(8):
        entries = []
        for pg, members in pairs.items():
            if r not in members:
                continue
            stuck = members in stuck_pairs
            entries.append({"process_group": (pg, f"g{pg}"), "collective_seq_id": 1,
                            "profiling_name": "nccl:all_reduce", "input_sizes": [[8]],
                            "input_dtypes": ["Float"],
                            "state": "started" if stuck else "completed", "retired": not stuck})
        ranks.append(RankEvidence(rank=r, trace=parse_dump({"entries": entries}, rank=r)))
    return AnalysisInput(ranks=tuple(ranks), world_size=8, pg_members={"0": (), **pairs},
                         locations=loc)


def test_comm_wedged_names_the_shared_switch() -> None:
    # Stuck: (4,6) inside l1, (1,5) and (3,7) crossing into l1. Healthy: (0,2), (0,1) in l0.
    rep = analyze(_wedged_input([(4, 6), (1, 5), (3, 7)]))
    assert rep.verdict is Verdict.COMM_WEDGED
    assert [(s.level, s.name) for s in rep.suspect_hardware] == [("leaf", "l1")]
    assert rep.culprit_ranks == (4, 5, 6, 7)
    assert "Suspect leaf l1" in rep.summary


def test_comm_wedged_with_nccl_errors_names_the_gpu() -> None:
    inp = _wedged_input([(4, 6)])
    ranks = tuple(RankEvidence(rank=e.rank, trace=e.trace,
                               log_errors=("NET/IB : Got completion from peer with status=12",)
                               if e.rank == 6 else ()) for e in inp.ranks)
    rep = analyze(AnalysisInput(ranks=ranks, world_size=8, pg_members=inp.pg_members,
                                locations=inp.locations))
    assert rep.verdict is Verdict.COMM_WEDGED
    assert rep.culprit_ranks == (6,)
    assert (rep.suspect_hardware[0].level, rep.suspect_hardware[0].name) == ("gpu", "n3/GPU0")


def test_non_collective_hang_all_ranks_with_the_stack() -> None:
    job = world_job(4)
    rep = analyze(evidence(job, stacks={r: "wait at loader.py:88" for r in range(4)}))
    assert rep.verdict is Verdict.NON_COLLECTIVE_HANG
    assert rep.culprit_ranks == (0, 1, 2, 3)
    assert "wait at loader.py:88" in rep.summary


def test_straggler_from_time_to_enter() -> None:
    job = world_job(4, n_ops=10, delay_s={2: 0.5})
    rep = analyze(evidence(job, trigger="straggler"))
    assert rep.verdict is Verdict.STRAGGLER
    assert rep.culprit_ranks == (2,)


def test_missing_dumps_lower_confidence_but_keep_the_culprit() -> None:
    rep_full = analyze(evidence(world_job(8, stop_before={3: 2})))
    rep = analyze(evidence(world_job(8, stop_before={3: 2}), drop=(5, 6)))
    assert rep.verdict is Verdict.NOT_JOINED
    assert 3 in rep.culprit_ranks
    assert rep.confidence < rep_full.confidence


def test_culprit_without_dump_is_named_from_the_others() -> None:
    rep = analyze(evidence(world_job(4, stop_before={1: 2}), drop=(1,)))
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (1,)
    assert "no evidence from rank 1" in rep.summary


def test_no_evidence_at_all_is_unknown() -> None:
    rep = analyze(AnalysisInput(ranks=(), world_size=4))
    assert rep.verdict is Verdict.UNKNOWN


def test_never_raises_on_garbage() -> None:
    bad = AnalysisInput(ranks=(RankEvidence(rank=0, trace="not a trace"),),  # type: ignore
                        world_size=2)
    rep = analyze(bad)
    assert rep.verdict is Verdict.UNKNOWN
    assert "error" in rep.details


def test_report_json_roundtrip_from_analysis() -> None:
    rep = analyze(evidence(world_job(4, replace={(1, 2): Op("0", sizes=((3,),))})))
    again = DiagnosisReport.from_dict(rep.to_dict())
    assert again.to_dict() == rep.to_dict()
    md = rep.to_markdown()
    assert md.splitlines()[0] == rep.summary


def test_512_ranks_analysis_is_fast_enough() -> None:
    groups = tp_dp_groups(512, 8)
    tp_of = {r: next(g for g, m in groups.items() if len(m) == 8 and r in m) for r in range(512)}
    dp_of = {r: next(g for g, m in groups.items() if len(m) == 64 and r in m)
             for r in range(512)}
    program = []
    for _ in range(2):
        program += [Op(tp_of[r], "all_gather") for r in range(0, 512, 8)]
        program += [Op(dp_of[r], "all_reduce") for r in range(8)]
    job = Job(world=512, groups=groups, program=program, stop_before={77: 70})
    inp = evidence(job)
    t0 = time.perf_counter()
    rep = analyze(inp)
    elapsed = time.perf_counter() - t0
    print(f"512-rank analysis: {elapsed * 1000:.0f} ms")
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (77,)


def test_simulator_sanity() -> None:
    dumps = simulate(world_job(2, n_ops=2, stop_before={1: 1}))
    assert [e["retired"] for e in dumps[0]["entries"]] == [True, False]
    assert len(dumps[1]["entries"]) == 1


def test_without_flight_recorder_the_stacks_name_the_culprit() -> None:
    # TORCH_FR_BUFFER_SIZE unset: no dumps, only each rank's stack.
    inside = PendingOp(op="all_reduce", pg="0", source="stack")
    ranks = tuple(RankEvidence(rank=r, stack="...", pending=() if r == 2 else (inside,),
                               top_of_stack="load at data.py:7" if r == 2 else None)
                  for r in range(4))
    rep = analyze(AnalysisInput(ranks=ranks, world_size=4))
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (2,)
    assert "from stacks" in rep.summary
    assert rep.confidence < 0.9


def test_isend_matched_by_recv_is_wedged_not_a_mismatch() -> None:
    ranks = (RankEvidence(rank=0, pending=(PendingOp(op="isend", is_p2p=True, peer=1),)),
             RankEvidence(rank=1, pending=(PendingOp(op="recv", is_p2p=True, peer=0),)))
    rep = analyze(AnalysisInput(ranks=ranks, world_size=2))
    assert rep.verdict is Verdict.COMM_WEDGED


def test_analysis_input_merges_group_membership_from_summaries() -> None:
    # Two ranks answered; rank 2 died after announcing. Group "1" is known only from summaries.
    dumps = simulate(Job(world=3, groups={"0": (0, 1, 2), "1": (0, 2)},
                         program=[Op("0"), Op("1"), Op("1")], stop_before={2: 2}))
    summaries = {r: {"rank": r, "fr_dump": dumps[r],
                     "process_groups": {"0": {"ranks": [0, 1, 2], "desc": "default_pg"},
                                        "1": {"ranks": [0, 2], "desc": "dp"}}}
                 for r in (0, 1)}
    inp = analysis_input(summaries, world_size=3, dead={2: "exit code -9"},
                         announcements={2: {"op": "all_reduce", "pg": "1", "seq": 2}})
    assert dict(inp.pg_members) == {"0": (0, 1, 2), "1": (0, 2)}
    assert inp.pg_names["1"] == "dp"
    rep = analyze(inp)
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.RANK_EXITED, (2,))
    assert "all_reduce #2 on pg 1 (dp)" in rep.summary
