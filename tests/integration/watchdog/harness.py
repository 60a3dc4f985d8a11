"""Real multi-process gloo jobs with an injected fault, evidence from a side thread, analysis.

Each rank is a spawned process: gloo process group on 127.0.0.1, Flight Recorder on, three
healthy all_reduces, then the scenario. A timer thread in every process calls
`workers.host.evidence.collect_evidence()` while the main thread is blocked (the stand-in for
the controller's diagnostics call after its stall threshold), then ends the process. The
parent reads the summaries, treats ranks that never answered as dead (with their exit code and
last announcement), and runs the pure analyzer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.inputs import AnalysisInput, analysis_input
from orchestrator.watchdog.report import DiagnosisReport
from workers.host.env import free_port

STAMP = "round1"
COLLECTIVE_TIMEOUT_S = 20  # longer than collection, so evidence is taken while blocked
WARMUP = 3


def blocked_in_user_code(seconds: float) -> None:
    """Where a hung rank sits: a Python loop outside torch.distributed."""
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(0.05)


def _start_collector(run_dir: str, rank: int, after_s: float) -> None:
    import threading

    from workers.host.evidence import collect_evidence

    def run() -> None:
        time.sleep(after_s)
        collect_evidence(run_dir, rank, stamp=STAMP, phase="diagnosis")
        # The parent ends the processes once every living rank has answered.

    threading.Thread(target=run, name="diagnostics", daemon=True).start()


def _mark_inject(run_dir: str, rank: int) -> None:
    Path(run_dir, f"inject_rank{rank}.txt").write_text(repr(time.time()))


def rank_main(rank: int, world: int, port: int, scenario: str, culprit: int, run_dir: str,
              collect_after_s: float) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist

    from workers.host.evidence import announce_collective, collect_evidence

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    t = torch.ones(16)
    for _ in range(WARMUP):
        dist.all_reduce(t)
    if scenario == "straggler":
        for _ in range(12):
            if rank == culprit:
                time.sleep(0.15)
            dist.all_reduce(t)
        _mark_inject(run_dir, rank)
        dist.barrier()
        collect_evidence(run_dir, rank, stamp=STAMP)
        os._exit(0)
    groups = _mesh_groups(rank, world) if scenario == "multi_pg" else {}
    _mark_inject(run_dir, rank)
    _start_collector(run_dir, rank, collect_after_s)
    try:
        _scenario(scenario, rank=rank, world=world, culprit=culprit, t=t, run_dir=run_dir,
                  announce=announce_collective, groups=groups)
    except Exception as ex:  # noqa: BLE001 - peers of an aborted rank see connection resets
        Path(run_dir, f"error_rank{rank}.txt").write_text(repr(ex))
    blocked_in_user_code(COLLECTIVE_TIMEOUT_S * 2)


def _mesh_groups(rank: int, world: int) -> dict[str, Any]:
    """tp=2 x dp=world/2, created by every rank in the same order (as DeviceMesh does)."""
    import torch.distributed as dist

    tp = [dist.new_group([r, r + 1], group_desc=f"tp{r // 2}") for r in range(0, world, 2)]
    dp = [dist.new_group(list(range(o, world, 2)), group_desc=f"dp{o}") for o in range(2)]
    return {"tp": tp[rank // 2], "dp": dp[rank % 2]}


def _scenario(name: str, *, rank: int, world: int, culprit: int, t: Any, run_dir: str,
              announce: Any, groups: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    if name == "multi_pg":
        for step in range(2):
            dist.all_reduce(t, group=groups["tp"])
            if step == 1 and rank == culprit:
                blocked_in_user_code(COLLECTIVE_TIMEOUT_S * 2)
            dist.all_reduce(t, group=groups["dp"])
    elif name == "not_joined":
        if rank == culprit:
            blocked_in_user_code(COLLECTIVE_TIMEOUT_S * 2)
        dist.all_reduce(t)
    elif name == "rank_exited":
        if rank == culprit:
            os._exit(3)
        dist.all_reduce(t)
    elif name == "mismatch":
        x = torch.ones(100 if rank == culprit else 16)
        announce(run_dir, rank, op="all_reduce", tensor=x)
        dist.all_reduce(x)
    elif name == "desync":
        for step in range(2):
            announce(run_dir, rank, op="all_reduce", tensor=t)
            dist.all_reduce(t)
            if step == 1 and rank == culprit:
                continue  # the skipped collective
            b = torch.ones(8)
            announce(run_dir, rank, op="broadcast", tensor=b)
            dist.broadcast(b, src=0)
        blocked_in_user_code(COLLECTIVE_TIMEOUT_S * 2)
    elif name == "p2p":
        # Pipeline 0 -> 1 -> ... -> world-1; stage `culprit` never sends downstream.
        if rank > 0:
            dist.recv(t, src=rank - 1)
        if rank == culprit:
            blocked_in_user_code(COLLECTIVE_TIMEOUT_S * 2)
        if rank < world - 1:
            dist.send(t, dst=rank + 1)
    elif name == "non_collective":
        blocked_in_user_code(COLLECTIVE_TIMEOUT_S * 2)
    else:
        raise ValueError(f"unknown scenario {name}")


@dataclass(frozen=True)
class Outcome:
    report: DiagnosisReport
    stall_to_verdict_s: float
    exit_codes: dict[int, int | None]
    summaries: dict[int, dict[str, Any]]


def run_scenario(scenario: str, *, world: int, culprit: int, run_dir: Path,
                 collect_after_s: float = 1.5, deadline_s: float = 90.0) -> Outcome:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=rank_main, daemon=True,
                         args=(r, world, port, scenario, culprit, str(run_dir),
                               collect_after_s)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        end = time.time() + deadline_s
        while time.time() < end:
            living = [r for r, p in enumerate(procs) if p.is_alive()]
            if all(_summary_path(run_dir, r).exists() for r in living):
                break
            time.sleep(0.05)
    finally:
        for p in procs:  # only the processes this harness started
            if p.is_alive():
                p.kill()
                p.join(5)
    exit_codes = {r: p.exitcode for r, p in enumerate(procs)}
    summaries = _read_summaries(run_dir, world)
    inp = evidence_from_run(run_dir, world=world, summaries=summaries, exit_codes=exit_codes,
                            trigger="straggler" if scenario == "straggler" else "stall")
    report = analyze(inp)
    verdict_t = time.time()
    injects = [float(p.read_text()) for p in run_dir.glob("inject_rank*.txt")]
    stall_to_verdict = verdict_t - min(injects) if injects else float("nan")
    (run_dir / "report.json").write_text(report.to_json())
    return Outcome(report=report, stall_to_verdict_s=stall_to_verdict, exit_codes=exit_codes,
                   summaries=summaries)


def _summary_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "diagnostics" / STAMP / f"rank{rank}" / "summary.json"


def _read_summaries(run_dir: Path, world: int) -> dict[int, dict[str, Any]]:
    out = {}
    for r in range(world):
        p = _summary_path(run_dir, r)
        if p.exists():
            out[r] = json.loads(p.read_text())
    return out


def evidence_from_run(run_dir: Path, *, world: int, summaries: dict[int, dict[str, Any]],
                      exit_codes: dict[int, int | None], trigger: str) -> AnalysisInput:
    """What the controller does: answered ranks are alive; the others are dead, with their
    exit code and the op they announced before dying."""
    from orchestrator.watchdog.evidence_files import read_announcement

    dead = {r: f"exit code {exit_codes.get(r)}" for r in range(world) if r not in summaries}
    anns = {r: a for r in dead if (a := read_announcement(run_dir, r)) is not None}
    return analysis_input(summaries, world_size=world, dead=dead, announcements=anns,
                          trigger=trigger, artifacts=(str(run_dir / "diagnostics" / STAMP),))
