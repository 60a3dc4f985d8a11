"""What one straggler probe costs the rank it reads: with py-spy's native dump, or without.

    .venv/bin/python bench/probe_pause.py [--rounds 6] [--out bench/results/probe_pause.json]

One process plays a training rank: torch and torch.distributed imported, a one-rank gloo
group with the Flight Recorder on, and a training thread that runs small steps (a matmul and
an all_reduce) back to back and records when each ends. The main thread stands in for the
worker actor's diagnostics thread: every round it collects the rank's evidence twice,
`collect_evidence(native=True)` (a hang round: stacks, Flight Recorder dump, logs, py-spy's
`dump --native` of this process) and `native=False` (the straggler probe), in alternating
order. For each it reports the call's wall time and the longest gap between two of the
training thread's step ends while it ran: how long the probe stopped training.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed as dist

    from meshyard._protocol import pyspy_path
    from workers.host.evidence import collect_evidence

    if pyspy_path() is None:
        print("py-spy is not installed: nothing to compare", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="probe-pause-"))
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0,
                            world_size=1)
    ends: list[float] = []
    stop = threading.Event()

    def train() -> None:
        a = torch.randn(128, 128)
        while not stop.is_set():
            t = a @ a
            dist.all_reduce(t)
            ends.append(time.monotonic())

    torch.set_num_threads(1)
    th = threading.Thread(target=train, daemon=True)
    th.start()
    time.sleep(1.0)
    rows: dict[str, list[dict[str, float]]] = {"native": [], "without": []}
    for i in range(args.rounds):
        order = ("native", "without") if i % 2 == 0 else ("without", "native")
        for kind in order:
            time.sleep(0.5)
            t0 = time.monotonic()
            collect_evidence(tmp / "run", 0, stamp=f"{kind}-{i}", native=kind == "native")
            t1 = time.monotonic()
            time.sleep(0.05)
            during = [t for t in ends if t0 - 0.5 <= t <= t1 + 0.05]
            gap = max((b - a for a, b in zip(during, during[1:], strict=False)), default=0.0)
            rows[kind].append({"wall_s": t1 - t0, "longest_stop_s": gap})
    stop.set()
    th.join(5)
    dist.destroy_process_group()
    result = {}
    for kind, rs in rows.items():
        result[kind] = {k: statistics.median(r[k] for r in rs)
                        for k in ("wall_s", "longest_stop_s")}
    result["stop_ratio"] = result["native"]["longest_stop_s"] / max(
        result["without"]["longest_stop_s"], 1e-6)
    result["rounds"] = args.rounds
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**result, "runs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
