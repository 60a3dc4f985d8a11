"""Evidence collection in this process: NCCL_DEBUG_FILE tail, stacks, announcements (worker
side), nvidia-smi -q (node side)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from orchestrator.runtime.node_evidence import collect_node_evidence
from orchestrator.watchdog import evidence_files
from orchestrator.watchdog.inputs import RankEvidence
from workers import evidence

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def test_collect_without_process_group_tails_nccl_debug_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host, pid = socket.gethostname(), os.getpid()
    log = tmp_path / f"nccl.{host}.{pid}.log"
    shutil.copy(FIX / "nccl_err_ib_completion_status12_nccl1814.log", log)
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="other-worker", daemon=True)
    t.start()
    try:
        s = evidence.collect_evidence(tmp_path / "run", 3, stamp="s1", step=41, phase="fwd")
    finally:
        stop.set()
    out = tmp_path / "run" / "diagnostics" / "s1" / "rank3"
    assert (out / "summary.json").exists() and (out / "stacks.txt").exists()
    assert "other-worker" in (out / "stacks.txt").read_text()
    assert "NCCL WARN NET/IB : Got completion" in (out / "nccl_debug_tail.log").read_text()
    assert len(s["log_errors"]) == 3 and "status=12" in s["log_errors"][0]
    assert s["errors"] == []
    ev = RankEvidence.from_summary(s)
    assert (ev.rank, ev.step, ev.phase, ev.alive) == (3, 41, "fwd", True)
    assert ev.log_errors == tuple(s["log_errors"])


def test_announcement_round_trip(tmp_path: Path) -> None:
    import torch

    ann = evidence.announce_collective(tmp_path, 2, op="all_reduce",
                                       tensor=torch.ones(5, 2, dtype=torch.bfloat16))
    assert (ann["sizes"], ann["dtypes"], ann["pg"]) == ([[5, 2]], ["torch.bfloat16"], "0")
    assert evidence_files.read_announcement(tmp_path, 2) == ann
    evidence_files.clear_announcement(tmp_path, 2)
    assert evidence_files.read_announcement(tmp_path, 2) is None


def test_node_evidence_runs_nvidia_smi_when_present(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert collect_node_evidence(tmp_path, stamp="s") == []
    # A stand-in binary (no GPU on this machine) checks the plumbing, not nvidia-smi itself.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho \"GPU 00000000:18:00.0 Xid $1\"\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    (path,) = collect_node_evidence(tmp_path, stamp="s", node="n0")
    assert path.endswith("node-n0/nvidia-smi-q.txt")
    assert Path(path).read_text().strip() == "GPU 00000000:18:00.0 Xid -q"
