"""A tiny stand-in for workers.loop.run_training (same signature) for plumbing tests only:
a gloo all_reduce loop with a step checkpoint per rank, and an optional crash via env."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def run(spec: Any, *, out_dir: str, callbacks: Any, steps: int | None = None,
        seed: int | None = None, stop_event: Any = None) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                            f"{os.environ['MASTER_PORT']}", rank=rank, world_size=world)
    ckpt = Path(out_dir) / f"tiny-ckpt-{rank}.json"
    start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    total = steps or spec.training.steps
    crash = os.environ.get("TINY_CRASH")  # "rank:step:attempt"
    print(f"rank {rank} starting at step {start}", flush=True)
    for step in range(start + 1, total + 1):
        if stop_event is not None and stop_event.is_set():
            break
        t = torch.ones(4) * (rank + 1)
        dist.all_reduce(t)
        if crash:
            r, s, a = (int(x) for x in crash.split(":"))
            if r == rank and s == step and a == int(os.environ.get("MESHYARD_ATTEMPT", "1")):
                raise RuntimeError(f"injected crash on rank {rank} at step {step}")
        callbacks.on_step({"step": step, "loss": 10.0 / step, "time": time.time(),
                           "tokens_per_s": 1.0, "step_time_s": 0.01, "grad_norm": 1.0})
        ckpt.write_text(json.dumps({"step": step}))
        time.sleep(float(os.environ.get("TINY_STEP_S", "0.05")))
    dist.destroy_process_group()
    return {"start": start}
