"""The local Ray `meshyard serve` starts on its embedded defaults (`init_local_ray`)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import ray

from orchestrator.runtime.service import init_local_ray


def _started_workers(session_dir: Path) -> list[str]:
    """The raylet's "Started worker process with pid N" lines: one per worker process."""
    text = (session_dir / "logs" / "raylet.out").read_text(errors="replace")
    return re.findall(r"Started worker process with pid \d+", text)


def test_local_ray_starts_worker_processes_only_for_work() -> None:
    """Ray's default starts one idle worker per CPU when the first driver connects; the local
    Ray starts none until there is work, then starts the task's."""
    init_local_ray(worker_ports=None, num_cpus=2)
    try:
        session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
        deadline = time.monotonic() + 5  # a prestart follows the driver's registration
        while time.monotonic() < deadline and not _started_workers(session):
            time.sleep(0.2)
        assert _started_workers(session) == []

        @ray.remote(num_cpus=0)
        def pid() -> int:
            import os

            return os.getpid()

        worker = ray.get(pid.remote(), timeout=120)
        started = _started_workers(session)
        assert f"Started worker process with pid {worker}" in started, started
    finally:
        ray.shutdown()
