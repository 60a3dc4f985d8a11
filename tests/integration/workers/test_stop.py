"""Cancelling: a stop_event set on ONE rank stops EVERY rank after the same step.

Two real gloo processes (torch.multiprocessing) call ``run_training`` in-process, as the Ray
worker actor does. Only rank 0's event is set (when step 3's metrics arrive); the stop vote
rides on the loop's loss all-reduce (workers/loop/stepsync.py, every few steps), so both ranks
return after the same sync step instead of rank 1 running on into the next step's
collectives alone. The stop also saves a checkpoint at that step.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from tests.integration.workers.launch_helpers import TINY
from workers.host.env import free_port
from workers.loop.stepsync import MAX_INTERVAL

STEPS = 100


def _worker(rank: int, port: int, out: str) -> None:
    from workers.host.env import DistEnv
    from workers.loop.checkpoint import complete_steps
    from workers.loop.launch import load_spec
    from workers.loop.train import run_training

    torch.set_num_threads(1)
    spec = load_spec(TINY / "ddp.yaml")
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(
        update={"enabled": True, "every_steps": 100})})
    stop = threading.Event()
    steps: list[int] = []

    class Callbacks:
        def on_step(self, m: dict[str, Any]) -> None:
            steps.append(m["step"])
            if rank == 0 and m["step"] == 3:
                stop.set()

        def on_heartbeat(self, hb: Any) -> None:
            pass

        def on_log(self, level: str, message: str) -> None:
            pass

    env = DistEnv(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                  master_addr="127.0.0.1", master_port=port)
    res = run_training(spec, out_dir=out, callbacks=Callbacks(), steps=STEPS, stop_event=stop,
                       dist_env=env)
    Path(out, f"result_{rank}.json").write_text(json.dumps({
        "stopped": res.stopped, "last_step": res.last_step, "steps": steps,
        "checkpoints": complete_steps(Path(out) / "checkpoints")}))


def test_stop_on_one_rank_stops_all_after_the_same_step(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in (0, 1)]
    last = results[0]["last_step"]
    # Step 3's row arrives at a sync step s >= 3; the stop takes effect at the next sync,
    # at most MAX_INTERVAL steps later.
    assert 3 < last <= 3 + 2 * MAX_INTERVAL < STEPS
    for r in results:
        assert r["stopped"] is True
        assert r["last_step"] == last
        assert r["steps"] == list(range(1, last + 1))  # every row, in order, none lost
    assert results[0]["checkpoints"] == [last]
