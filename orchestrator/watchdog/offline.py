"""Offline diagnosis: Flight Recorder dump files and logs from ANY PyTorch job -> report.

Pure module (stdlib only); the engine behind `meshyard diagnose --fr DIR --logs DIR`.
Dump files are what `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` / `TORCH_FR_DUMP_TEMP_FILE` produce
(`<prefix><rank>`, pickled) or the JSON variant; the rank is the file name's trailing number.
Logs add what dumps lack: per-rank errors (NCCL WARN, watchdog timeouts), progress when there
is no dump (`last enqueued / completed work`, the desync report's snapshot), where ranks ran
(`nccl_init`: host and CUDA device), and which ranks exited (torchrun's failure summary: rank,
host, exit code, exception, time), so a rank that died is named as the cause of the others'
wait. Cut (`partial`) events count only for the fields they have. Never raises: unreadable
inputs become `problems`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.flight_recorder import RankTrace, load_dump, parse_dump
from orchestrator.watchdog.inputs import DEFAULT_PG, AnalysisInput, PendingOp, RankEvidence
from orchestrator.watchdog.logs import ERROR_KINDS, LogEvent, errors_by_rank, parse_text
from orchestrator.watchdog.report import DiagnosisReport, RankLocation, Verdict

_OP_NAMES = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "ALLTOALL": "all_to_all",
             "REDUCE_SCATTER": "reduce_scatter", "ALLTOALL_BASE": "all_to_all_single"}


def op_name(op_type: str) -> str:
    """PyTorch log OpType -> Flight Recorder op name: ALLREDUCE -> all_reduce."""
    return _OP_NAMES.get(op_type.upper(), op_type.lower())


@dataclass
class _RankLog:
    errors: list[str] = field(default_factory=list)
    last_work: dict[str, tuple[int, int]] = field(default_factory=dict)  # pg -> (enq, done)
    timeouts: list[tuple[int | None, str]] = field(default_factory=list)  # (seq, op)
    desync: tuple[str, int] | None = None  # ("finished"|"started", seq)
    desync_op: str = ""
    location: RankLocation | None = None
    fingerprint: PendingOp | None = None
    exit_info: str | None = None
    exit_time_s: float | None = None
    exit_code: int | None = None
    artifacts: tuple[str, ...] = ()


def _exit_time(text: str | None) -> float | None:
    """torchrun prints `2024-05-19_16:39:58` (the agent's local clock): seconds on one scale
    for ordering the exits of one job."""
    try:
        return datetime.strptime(str(text), "%Y-%m-%d_%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def exit_description(e: LogEvent) -> str:
    """'exit code 1: RuntimeError: boom' — what a `rank_exited` event says about the exit."""
    code = e.get("exit_code")
    sig = e.get("signal")
    text = "exited" if code is None else f"exit code {code}" + (f" ({sig})" if sig else "")
    exc = e.get("exception")
    if exc and not str(exc).startswith("Signal "):
        text += f": {exc}"
    return text


def _record_exit(out: dict[int, _RankLog], e: LogEvent) -> None:
    rank = e.get("rank")
    if not isinstance(rank, int):
        return
    rl = out.setdefault(rank, _RankLog())
    t = _exit_time(e.get("time"))
    if rl.exit_time_s is not None and t is not None and t > rl.exit_time_s:
        return  # several summaries name the rank: its first exit is the one that counts
    rl.exit_info, rl.exit_time_s, rl.exit_code = exit_description(e), t, e.get("exit_code")
    if e.get("error_file"):
        rl.artifacts = (str(e.get("error_file")),)
    if rl.location is None and e.get("host"):
        rl.location = RankLocation(node=e.get("host"))


def _rank_logs(events: Sequence[LogEvent]) -> tuple[dict[int, _RankLog], int]:
    out: dict[int, _RankLog] = {}
    nranks = 0
    for r, errs in errors_by_rank(events).items():
        out.setdefault(r, _RankLog()).errors += errs
    for e in events:
        rank = e.get("rank", e.get("launcher_rank"))
        if e.kind == "nccl_init":
            nranks = max(nranks, int(e.get("nranks") or 0))
            out.setdefault(e.get("rank"), _RankLog()).location = RankLocation(
                node=e.get("host"), gpu=e.get("cuda_dev"))
        elif e.kind == "rank_exited":
            _record_exit(out, e)
        elif (e.kind == "torch_last_work" and isinstance(rank, int)
              and e.get("last_completed") is not None):
            pg = str(e.get("pg") or DEFAULT_PG)
            out.setdefault(rank, _RankLog()).last_work[pg] = (e.get("last_enqueued"),
                                                              e.get("last_completed"))
        elif (e.kind == "torch_watchdog_timeout" and isinstance(rank, int)
              and not (e.get("partial") and e.get("seq") is None)):
            out.setdefault(rank, _RankLog()).timeouts.append((e.get("seq"),
                                                              op_name(e.get("op_type") or "?")))
        elif e.kind == "desync_report":
            _desync_snapshot(out, e)
        elif e.kind == "collective_mismatch":
            _mismatch_fingerprints(out, e)
    return out, nranks


def _mismatch_fingerprints(out: dict[int, _RankLog], e: LogEvent) -> None:
    """ProcessGroupWrapper's report names two ranks' fingerprints at one seq."""
    seq = e.get("seq")
    for r, fp in (e.get("fingerprints") or {}).items():
        if seq is None or not fp or fp.get("partial"):
            continue
        shape = [int(x) for x in re.findall(r"\d+", fp.get("shape") or "")]
        out.setdefault(int(r), _RankLog()).fingerprint = PendingOp(
            op=op_name(fp.get("op_type") or "?"), seq=seq, sizes=(tuple(shape),),
            dtypes=tuple(d.strip() for d in (fp.get("dtypes") or "").split(",") if d.strip()),
            source="log")


def _desync_snapshot(out: dict[int, _RankLog], e: LogEvent) -> None:
    for key, groups in (e.get("snapshot") or {}).items():
        m = re.match(r"#(\d+) (\w+)", key)
        if not m:
            continue
        for g in groups:
            for r in g.get("ranks", ()):
                rl = out.setdefault(r, _RankLog())
                rl.desync = (m.group(2), int(m.group(1)))
                rl.desync_op = op_name(str(g.get("state", "")).split(" ")[-1])


def _from_log(rank: int, rl: _RankLog, no_seqs: bool) -> RankEvidence:
    """Progress from logs alone: enqueued/completed per group, the op each rank timed out in."""
    trace = None
    pending: list[PendingOp] = []
    if rl.last_work:
        trace = parse_dump({"pg_status": {pg: {"last_enqueued_collective": done,
                                               "last_completed_collective": done}
                                          for pg, (_, done) in rl.last_work.items()}}, rank=rank)
        for pg, (enq, done) in rl.last_work.items():
            if enq > done:
                pending.append(PendingOp(op="?", pg=pg, seq=done + 1, source="log"))
    pg = next(iter(rl.last_work), DEFAULT_PG)
    for seq, op in rl.timeouts[:1]:
        # Old PyTorch prints no SeqNum: every rank's first timeout is its oldest pending op.
        seq = seq if seq is not None else (1 if no_seqs else None)
        if seq is not None:
            pending = [p for p in pending if p.seq != seq]
            pending.append(PendingOp(op=op, pg=pg, seq=seq, source="log"))
    if rl.fingerprint is not None:
        pending = [p for p in pending if p.seq != rl.fingerprint.seq] + [rl.fingerprint]
    if rl.desync and not pending:
        what, seq = rl.desync
        if what == "finished":
            trace = parse_dump({"pg_status": {DEFAULT_PG: {
                "last_enqueued_collective": seq, "last_completed_collective": seq}}}, rank=rank)
        else:
            pending.append(PendingOp(op=rl.desync_op, seq=seq, source="log"))
    return _liveness(RankEvidence(rank=rank, trace=trace, pending=tuple(pending),
                                  log_errors=tuple(rl.errors[:10])), rl)


_ABORT_CODES = (-6, 134)  # SIGABRT: how ProcessGroupNCCL's watchdog takes a process down


def _liveness(ev: RankEvidence, rl: _RankLog) -> RankEvidence:
    """`ev` marked exited when the logs say the rank's process exited. A rank its own NCCL
    watchdog aborted after a collective timed out was waiting when the job hung: it stays a
    waiter (its exit is listed with its errors), so the rank it waited for is named."""
    if rl.exit_info is None:
        return ev
    if rl.timeouts and rl.exit_code in _ABORT_CODES:
        note = f"aborted after its watchdog timeout ({rl.exit_info})"
        return replace(ev, log_errors=(*ev.log_errors, note), artifacts=rl.artifacts)
    return replace(ev, alive=False, exit_info=rl.exit_info, exit_time_s=rl.exit_time_s,
                   artifacts=rl.artifacts)


@dataclass(frozen=True)
class OfflineInput:
    analysis: AnalysisInput
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # error events from the logs, with or without a rank


def _load_traces(paths: Iterable[Path], problems: list[str]) -> dict[int, RankTrace]:
    traces: dict[int, RankTrace] = {}
    for p in paths:
        try:
            tr = _load_one(p)
        except Exception as ex:  # noqa: BLE001 - one bad file must not stop the diagnosis
            problems.append(f"{p}: unreadable dump ({type(ex).__name__}: {ex})")
            continue
        if tr.rank is None:
            problems.append(f"{p}: no rank in the file name; skipped")
        else:
            traces[tr.rank] = tr
    return traces


def _load_one(p: Path) -> RankTrace:
    head = p.read_bytes()[:1]
    if head == b"{":
        m = re.search(r"(\d+)(?:\.\w+)?$", p.name)
        return parse_dump(json.loads(p.read_text()), rank=int(m.group(1)) if m else None)
    return load_dump(p)


def _files(d: Path | None) -> list[Path]:
    if d is None:
        return []
    if d.is_file():
        return [d]
    return sorted(p for p in d.rglob("*") if p.is_file())


def build_offline_input(*, fr_dir: Path | None = None, logs_dir: Path | None = None,
                        world_size: int | None = None) -> OfflineInput:
    problems: list[str] = []
    traces = _load_traces(_files(fr_dir), problems)
    events: list[LogEvent] = []
    for p in _files(logs_dir):
        try:
            events += parse_text(p.read_text(errors="replace"))
        except OSError as ex:
            problems.append(f"{p}: unreadable log ({ex})")
    logs, nranks = _rank_logs(events)
    logs = {r: rl for r, rl in logs.items() if isinstance(r, int)}
    world = world_size or max([nranks, *(r + 1 for r in traces), *(r + 1 for r in logs), 0])
    no_seqs = all(seq is None for rl in logs.values() for seq, _ in rl.timeouts)
    members: dict[str, tuple[int, ...]] = {}
    ranks = []
    for r in range(world):
        rl = logs.get(r, _RankLog())
        if r in traces:
            ev = _liveness(RankEvidence(rank=r, trace=traces[r],
                                        log_errors=tuple(rl.errors[:10])), rl)
            for pg, cfg in traces[r].pg_config.items():
                members.setdefault(pg, cfg.ranks)
        elif r in logs:
            ev = _from_log(r, rl, no_seqs)
        else:
            continue
        ranks.append(ev)
    locations = {r: rl.location for r, rl in logs.items() if rl.location is not None}
    members = {pg: m for pg, m in members.items() if m}
    warnings = tuple(e.describe() for e in events if e.kind in ERROR_KINDS)
    return OfflineInput(AnalysisInput(ranks=tuple(ranks), world_size=world, pg_members=members,
                                      locations=locations, trigger="manual"),
                        tuple(problems), warnings)


def diagnose_offline(*, fr_dir: Path | None = None, logs_dir: Path | None = None,
                     world_size: int | None = None) -> DiagnosisReport:
    """Build the input from files and analyze it; problems land in `details["problems"]`."""
    try:
        off = build_offline_input(fr_dir=fr_dir, logs_dir=logs_dir, world_size=world_size)
    except Exception as ex:  # noqa: BLE001
        return DiagnosisReport(verdict=Verdict.UNKNOWN, culprit_ranks=(), confidence=0.0,
                               summary=f"Could not read the inputs: {ex}",
                               details={"error": str(ex)})
    rep = analyze(off.analysis)
    if not off.problems and not (rep.verdict is Verdict.UNKNOWN and off.warnings):
        return rep
    d = rep.to_dict()
    d["details"] = {**d["details"], "problems": list(off.problems)}
    if rep.verdict is Verdict.UNKNOWN and off.warnings:
        d["summary"] = (f"No per-rank progress in the inputs; the logs hold {len(off.warnings)} "
                        f"NCCL/PyTorch error(s), first: {off.warnings[0]}")
        d["details"]["log_errors"] = list(off.warnings[:20])
    return DiagnosisReport.from_dict(d)
