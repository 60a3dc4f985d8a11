"""Offline diagnosis from dump files and logs of any PyTorch job (`meshyard diagnose`)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

from orchestrator.watchdog.offline import build_offline_input, diagnose_offline, op_name
from orchestrator.watchdog.report import Verdict

FIX = Path(__file__).resolve().parents[2] / "fixtures"
LOGS = FIX / "logs"


def test_desync_report_log_names_rank_7() -> None:
    rep = diagnose_offline(logs_dir=LOGS / "torch_desync_debug_report_pytorch152623.log")
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (7,)


def test_old_watchdog_log_shows_rank0_in_a_different_collective() -> None:
    rep = diagnose_offline(logs_dir=LOGS / "torch_watchdog_timeout_old_noseq_accelerate157.log")
    assert rep.verdict is Verdict.COLLECTIVE_MISMATCH
    assert rep.culprit_ranks == (0,)
    (m,) = rep.mismatches
    assert (m.field, m.expected, m.actual, m.agreeing) == ("op", "broadcast",
                                                           {0: "all_reduce"}, (1, 2, 3, 4, 7))


def test_pg_wrapper_shapes_without_majority_names_both() -> None:
    rep = diagnose_offline(logs_dir=LOGS / "torch_pgwrapper_mismatch_shape_msswift9443.log")
    assert rep.verdict is Verdict.COLLECTIVE_MISMATCH
    assert rep.culprit_ranks == (0, 1)
    assert rep.confidence <= 0.5
    assert rep.mismatches[0].seq == 3104 and rep.mismatches[0].field == "sizes"


def test_log_without_ranks_is_unknown_but_quotes_the_error() -> None:
    rep = diagnose_offline(logs_dir=LOGS / "nccl_err_ib_completion_status12_nccl1814.log")
    assert rep.verdict is Verdict.UNKNOWN
    assert "status=12" in rep.summary
    assert len(rep.details["log_errors"]) == 3


def test_dump_dir_with_a_bad_file_and_a_json_dump(tmp_path: Path) -> None:
    d = tmp_path / "fr"
    d.mkdir()
    shutil.copy(FIX / "fr" / "gloo_torch2.13_notjoined_rank0.pkl", d / "trace_0")
    raw1 = pickle.loads((FIX / "fr" / "gloo_torch2.13_notjoined_rank1.pkl").read_bytes())
    (d / "trace_1.json").write_text(json.dumps(raw1))
    (d / "trace_2").write_bytes(b"\x80garbage")
    rep = diagnose_offline(fr_dir=d, world_size=2)
    assert rep.verdict is Verdict.NOT_JOINED
    assert rep.culprit_ranks == (1,)
    assert any("trace_2" in p for p in rep.details["problems"])


def test_logs_add_locations_and_errors_to_dumps(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "r1.log").write_text(
        "node-b:10:11 [1] NCCL INFO comm 0x1 rank 1 nranks 2 cudaDev 1 busId 1000 - Init COMPLETE\n"
        "[rank1]:[E1 x] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL("
        "SeqNum=3, OpType=ALLREDUCE, NumelIn=12, NumelOut=12, Timeout(ms)=600000) ran for 1 "
        "milliseconds before timing out.\n")
    off = build_offline_input(fr_dir=FIX / "fr" / "gloo_torch2.13_notjoined_rank0.pkl",
                              logs_dir=logs)
    assert off.analysis.world_size == 2
    assert off.analysis.locations[1].node == "node-b" and off.analysis.locations[1].gpu == 1
    r1 = next(e for e in off.analysis.ranks if e.rank == 1)
    assert r1.trace is None and "torch_watchdog_timeout" in r1.log_errors[0]


def test_op_names() -> None:
    assert [op_name(x) for x in ("ALLREDUCE", "_ALLGATHER_BASE", "BROADCAST")] == [
        "all_reduce", "_allgather_base", "broadcast"]


def test_missing_inputs_never_raise(tmp_path: Path) -> None:
    rep = diagnose_offline(fr_dir=tmp_path / "nope", logs_dir=tmp_path / "nope2")
    assert rep.verdict is Verdict.UNKNOWN
