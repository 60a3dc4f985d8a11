"""What a rank process costs to reach its first DDP step: started cold, or forked from a parent
that imported torch once.

    .venv/bin/python bench/rank_fork.py [--rounds 5] [--out bench/results/rank_fork.json]

Each round starts a 2-rank gloo world twice, alternating which goes first:

  * cold   — two `python -c` processes (posix_spawn of this interpreter), each importing torch,
             torch._dynamo, torch.distributed and torch.nn.parallel, as every worker actor,
             prestarted and cold user-code rank does today;
  * forked — two children forked from this process, which imported the same modules once,
             made no torch call before forking and runs no other thread.

Both then do the same work: join the process group (TCP store on 127.0.0.1), wrap a small
MLP in DistributedDataParallel (which imports torch._dynamo if it is not in yet), one
forward, backward and AdamW step, destroy the group and exit. The figures are each child's
own CPU (user + sys from wait4's rusage, so nothing the parent did counts) and the wall
time from the start of the world to both ranks' exit. The parent's one import is reported
on its own: a node that forks its ranks pays it once, not once per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

IMPORTS = "import torch, torch._dynamo, torch.distributed, torch.nn.parallel"

# A rank's work once its process group is up: wrap an MLP in DDP, one step, leave the group.
DDP_STEP = """
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(16, 64)).sum().backward()
opt.step()
dist.destroy_process_group()
"""

RANK_WORK = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=2, timeout=timedelta(seconds=60))
""" + DDP_STEP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu(rusage: Any) -> float:
    return float(rusage.ru_utime + rusage.ru_stime)


def _wait_all(pids: list[int]) -> list[float]:
    cpu = []
    for pid in pids:
        _, status, rusage = os.wait4(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"rank process {pid} exited {os.waitstatus_to_exitcode(status)}")
        cpu.append(_cpu(rusage))
    return cpu


def cold_world() -> dict[str, Any]:
    port, t0 = _free_port(), time.perf_counter()
    code = IMPORTS + "\n" + RANK_WORK
    pids = [os.posix_spawn(sys.executable, [sys.executable, "-c", code, str(r), str(port)],
                           os.environ) for r in (0, 1)]
    cpu = _wait_all(pids)
    return {"wall_s": time.perf_counter() - t0, "cpu_s_per_rank": statistics.fmean(cpu)}


def forked_world() -> dict[str, Any]:
    port, t0 = _free_port(), time.perf_counter()
    pids = []
    for r in (0, 1):
        pid = os.fork()
        if pid == 0:  # the rank: the same work, its modules already in memory
            try:
                sys.argv = ["rank", str(r), str(port)]
                exec(compile(RANK_WORK, "<rank>", "exec"), {"__name__": "__rank__"})  # noqa: S102
            except BaseException:  # noqa: BLE001 - the parent sees the exit code
                import traceback

                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        pids.append(pid)
    cpu = _wait_all(pids)
    return {"wall_s": time.perf_counter() - t0, "cpu_s_per_rank": statistics.fmean(cpu)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    load_before = os.getloadavg()[0]
    t = time.process_time()
    exec(IMPORTS)  # noqa: S102 - the parent's one import, measured
    parent_import_cpu_s = time.process_time() - t

    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "forked": []}
    for i in range(args.rounds):
        order = ("cold", "forked") if i % 2 == 0 else ("forked", "cold")
        for kind in order:
            runs[kind].append(cold_world() if kind == "cold" else forked_world())

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    out = {"rounds": args.rounds, "cpus": os.cpu_count(),
           "parent_import_cpu_s": round(parent_import_cpu_s, 3),
           "cold": {"cpu_s_per_rank": round(med("cold", "cpu_s_per_rank"), 3),
                    "wall_s": round(med("cold", "wall_s"), 3)},
           "forked": {"cpu_s_per_rank": round(med("forked", "cpu_s_per_rank"), 3),
                      "wall_s": round(med("forked", "wall_s"), 3)},
           "runs": runs}
    out["cpu_ratio_cold_over_forked"] = round(
        out["cold"]["cpu_s_per_rank"] / max(out["forked"]["cpu_s_per_rank"], 1e-3), 1)
    out["wall_ratio_cold_over_forked"] = round(
        out["cold"]["wall_s"] / max(out["forked"]["wall_s"], 1e-3), 1)
    out["load_1min_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(f"parent's import: {out['parent_import_cpu_s']:.2f} CPU-s (once)")
    for kind in ("cold", "forked"):
        print(f"{kind:>6}: {out[kind]['cpu_s_per_rank']:.3f} CPU-s per rank, "
              f"{out[kind]['wall_s']:.3f} s to both ranks' exit (median of {args.rounds})")
    print(f"cold / forked: {out['cpu_ratio_cold_over_forked']}x CPU, "
          f"{out['wall_ratio_cold_over_forked']}x wall")
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
