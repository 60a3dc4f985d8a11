"""The worker actor's report buffer on a full disk: the metrics file it keeps for recovery
stops being written, the rows still reach the polls, and closing it raises nothing (the
rank's own result, a failed checkpoint save naming the disk, is what its run call returns)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.host.actor import _Buffer
from workers.host.assignment import WorkerState


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_full_disk_stops_the_metrics_file_not_the_rank() -> None:
    buf = _Buffer(rank=1, metrics_file=Path("/dev/full"))  # every write: ENOSPC
    buf.metric({"step": 1, "loss": 0.5})
    buf.pending({"step": 2})
    buf.metric({"step": 2, "loss": 0.4})
    buf.close()  # its unwritten line is dropped, not raised
    polled = buf.drain(WorkerState.RUNNING)
    assert [(r["rank"], r["step"], r["loss"]) for r in polled.metrics] == [(1, 1, 0.5),
                                                                          (1, 2, 0.4)]


def test_rows_reach_the_file_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "rank-0.metrics.jsonl"
    buf = _Buffer(rank=0, metrics_file=path)
    buf.pending({"step": 1})
    assert path.read_text().count("\n") == 1  # in the file once pending() returns
    buf.metric({"step": 1, "loss": 0.5})
    buf.close()
    assert path.read_text().count("\n") == 2
