"""The loop's per-step announcement in a process that runs two jobs (a warm-pool worker):
it must name the current job's op, not the previous job's counters."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_announcement_counts_this_jobs_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    monkeypatch.setenv("MESHYARD_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    import torch
    import torch.distributed as dist

    from orchestrator.watchdog.evidence_files import read_announcement
    from workers.host.evidence import announce_step_collective

    assert not dist.is_initialized()  # no group left behind by another test
    seen = []
    for n_ops in (5, 2):  # job 1 runs 5 all-reduces, job 2 (same process) runs 2
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_port()}", rank=0,
                                world_size=1)
        try:
            t = torch.ones(3)
            for _ in range(n_ops):
                dist.all_reduce(t)
            announce_step_collective("all_reduce", t)
            seen.append(read_announcement(tmp_path, 0))
        finally:
            dist.destroy_process_group()
    assert [a["op_id"] for a in seen] == [6, 3]  # type: ignore[index]
    assert seen[1] == {**seen[1], "op": "all_reduce", "sizes": [[3]], "seq": None}
    assert json.loads((tmp_path / "diagnostics" / "live" / "rank0" / "pending.json")
                      .read_text())["op_id"] == 3
