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
from workers.host import evidence

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


def test_an_announcement_the_job_linked_elsewhere_is_not_read(tmp_path: Path) -> None:
    """The run dir is the job's to write: its rank's pending.json made a link to a JSON file
    of the control plane (or a FIFO, which would block the reader) is not followed."""
    secret = tmp_path / "server.json"
    secret.write_text('{"admin_token": "msy_admin"}')
    run = tmp_path / "run"
    link = evidence_files.announcement_path(run, 0)
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    assert evidence_files.read_announcement(run, 0) is None
    fifo = evidence_files.announcement_path(run, 1)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    assert evidence_files.read_announcement(run, 1) is None


def _stand_in(bin_dir: Path, name: str, script: str) -> None:
    exe = bin_dir / name
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(0o755)


def test_node_evidence_runs_nvidia_smi_and_reads_the_kernel_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert collect_node_evidence(tmp_path, stamp="s") == {"paths": [], "gpus": []}
    # Stand-in binaries (no GPU on this machine) print real-format dumps: this checks the
    # plumbing and the parse on the node, not nvidia-smi itself.
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = fixtures / "smi_q_h100_2gpu_dram_uncorrectable_row_pending.txt"
    _stand_in(bin_dir, "nvidia-smi", f'[ "$1" = "-q" ] && /bin/cat {smi}')
    _stand_in(bin_dir, "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not "
                                "permitted' >&2; exit 1")  # kernel.dmesg_restrict
    _stand_in(bin_dir, "journalctl", f"/bin/cat {fixtures / 'dmesg_nvrm_xid_h100_node.txt'}")
    monkeypatch.setenv("PATH", str(bin_dir))
    got = collect_node_evidence(tmp_path, stamp="s", node="n0")
    smi_path, kernel_path = got["paths"]
    assert smi_path.endswith("node-n0/nvidia-smi-q.txt")
    assert Path(smi_path).read_text() == smi.read_text()
    assert kernel_path.endswith("node-n0/kernel-xid.log")
    assert all("NVRM: Xid" in ln for ln in Path(kernel_path).read_text().splitlines())
    healthy, bad = got["gpus"]
    assert healthy == {"index": 0, "bus_id": "00000000:18:00.0", "reasons": [],
                       "other_xids": [13, 43]}
    assert bad["index"] == 1 and "Xid 79: GPU has fallen off the bus" in bad["reasons"]
    assert "2 uncorrectable ECC errors (volatile)" in bad["reasons"]
