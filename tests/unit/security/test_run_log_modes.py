"""Run logs carry a job's output: created readable by their owner only."""

from __future__ import annotations

import stat
from pathlib import Path

from workers.host.logcapture import LogCapture
from workers.loop.callbacks import FileCallbacks


def test_rank_logs_and_metrics_are_0600(tmp_path: Path) -> None:
    cb = FileCallbacks(tmp_path, rank=0)
    cb.on_log("INFO", "hello")
    cb.on_step({"step": 1, "loss": 1.0})
    for path in (tmp_path / "logs" / "rank_0.log", tmp_path / "metrics.jsonl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_captured_stdout_and_stderr_are_0600(tmp_path: Path) -> None:
    cap = LogCapture(stdout=tmp_path / "out.log", stderr=tmp_path / "err.log",
                     beneath=tmp_path, sink=lambda stream, line: None)
    cap.start()
    try:
        print("captured", flush=True)
    finally:
        cap.stop()
    for name in ("out.log", "err.log"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
