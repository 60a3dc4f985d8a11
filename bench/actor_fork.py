"""What a worker actor costs to start under Ray: started by Ray itself, or forked from the
fork server (workers/host/forkserver.py).

    .venv/bin/python bench/actor_fork.py [--rounds 4] [--actors 6] [--out FILE.json]

A local Ray instance (127.0.0.1, no dashboard). Each round starts `--actors` actors twice,
alternating which way goes first:

  * ray    — the actor's process started by the raylet (`python default_worker.py`), as
             Ray starts any actor;
  * forked — the same actor class with `runtime_env=workers.host.forkserver.runtime_env()`:
             the raylet starts the client (through Ray's setup_worker.py, as for any
             runtime_env), which has the server fork the worker.

Every actor then imports what a rank of the built-in loop imports before its first step
(torch, torch._dynamo, torch.distributed, torch.nn.parallel: a forked one has them already)
and answers one call. The figures are the whole machine's CPU (/proc/stat, both cores: the
raylet's, the runtime-env agent's and setup_worker's share included) and the wall time from
the first `.remote()` to the last answer, then the actors are killed and the machine left to
settle. The server's own start (one torch import) is a warm-up round of its own, reported
apart: a node pays it once per Ray temp dir while actors keep coming within its idle time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def machine_cpu() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def settle(max_s: float = 20.0) -> None:
    """Waits until the machine has been quiet for a second (or max_s)."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        a = machine_cpu()
        time.sleep(1.0)
        if machine_cpu() - a < 0.15:
            return


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--actors", type=int, default=6)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from workers.host.forkserver import runtime_env

    @ray.remote(num_cpus=0)
    class Rank:
        def ready(self) -> int:
            import torch  # noqa: F401
            import torch._dynamo  # noqa: F401
            import torch.distributed  # noqa: F401
            import torch.nn.parallel  # noqa: F401

            return os.getpid()

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    envs = {"ray": {}, "forked": runtime_env()}

    def start(way: str) -> dict[str, float]:
        settle()
        cpu0, t0 = machine_cpu(), time.perf_counter()
        actors = [Rank.options(runtime_env=envs[way]).remote() for _ in range(args.actors)]
        ray.get([a.ready.remote() for a in actors], timeout=600)
        out = {"cpu_s": machine_cpu() - cpu0, "wall_s": time.perf_counter() - t0}
        for a in actors:
            ray.kill(a, no_restart=True)
        return out

    try:
        start("ray")  # Ray's own warm-up (its first workers, the runtime-env agent)
        server = start("forked")  # includes the fork server's start
        runs: dict[str, list[dict[str, float]]] = {"ray": [], "forked": []}
        for r in range(args.rounds):
            for way in (("ray", "forked") if r % 2 == 0 else ("forked", "ray")):
                runs[way].append(start(way))
                print(f"round {r + 1} {way}: {runs[way][-1]['cpu_s']:.1f} CPU-s, "
                      f"{runs[way][-1]['wall_s']:.1f} s", flush=True)
    finally:
        ray.shutdown()
    med = {w: {k: statistics.median(x[k] for x in v) for k in ("cpu_s", "wall_s")}
           for w, v in runs.items()}
    result: dict[str, Any] = {
        "actors_per_round": args.actors, "rounds": args.rounds, "median": med,
        "per_actor_cpu_s": {w: m["cpu_s"] / args.actors for w, m in med.items()},
        "cpu_ratio": med["ray"]["cpu_s"] / med["forked"]["cpu_s"],
        "wall_ratio": med["ray"]["wall_s"] / med["forked"]["wall_s"],
        "first_forked_round_with_server_start": server, "runs": runs,
        "load": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(json.dumps({k: result[k] for k in ("median", "per_actor_cpu_s", "cpu_ratio",
                                              "wall_ratio")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
