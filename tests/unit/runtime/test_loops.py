"""The runtime's background loops: a submission's poke runs the scheduling loops at once and
leaves node sampling to its own interval (a poke right after a sample would take another)."""

from __future__ import annotations

import threading
from pathlib import Path

from orchestrator.settings import Settings
from orchestrator.store import open_store


def test_poke_runs_the_scheduling_loops_now_and_leaves_node_usage_to_its_interval(
        tmp_path: Path) -> None:
    from orchestrator.runtime.service import Runtime, _Loop

    store = open_store(f"sqlite:///{tmp_path / 'meshyard.db'}")
    rt = Runtime(Settings(data_dir=tmp_path), store)
    passes = {"scheduler": threading.Semaphore(0), "usage": threading.Semaphore(0)}
    rt._loops = [_Loop("scheduler", passes["scheduler"].release, 3600),
                 _Loop("usage", passes["usage"].release, 3600, pokeable=False)]
    for loop in rt._loops:
        loop.start()
    try:
        assert passes["scheduler"].acquire(timeout=10) and passes["usage"].acquire(timeout=10)
        rt.poke()
        assert passes["scheduler"].acquire(timeout=10)  # at once, not in an hour
        assert not passes["usage"].acquire(timeout=0.5)
    finally:
        for loop in rt._loops:
            loop.stop()
        store.close()
