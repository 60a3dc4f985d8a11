"""What a Ray worker process costs to start: through Ray's own setup worker, or through
meshyard's (workers/host/setup_worker.py), on the same work in one run.

    .venv/bin/python bench/setup_worker.py [--rounds 4] [--actors 6] [--out FILE.json]

One simulated cluster (ray.cluster_utils.Cluster, 127.0.0.1): a head with no CPUs and two
nodes of 2 CPUs, one started with Ray's setup worker ("ray") and one with meshyard's
("meshyard"). Each round starts, on each node in turn (alternating which goes first), three
kinds of worker process:

  * actor  — a plain actor (no runtime_env): the process Ray starts for any actor;
  * forked — an actor with the fork server's runtime_env (workers/host/forkserver.py), as
             meshyard starts its worker actors (the server's own start is a warm-up round);
  * task   — `--actors` plain tasks that each need a new worker (one per call, as an
             attempt's reads on a node do).

The figure is the whole machine's CPU (/proc/stat, both cores: the raylet's and the workers')
from the first `.remote()` to the last answer, per process, median over the rounds; the
processes are killed and the machine left to settle between measurements.
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

from actor_fork import machine_cpu, settle  # noqa: E402 - bench/, this script's folder

KINDS = ("actor", "forked", "task")
WAYS = ("ray", "meshyard")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--actors", type=int, default=6)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    os.environ.setdefault("RAY_enable_worker_prestart", "0")
    import ray
    from ray.cluster_utils import Cluster

    from workers.host import setup_worker
    from workers.host.forkserver import runtime_env

    @ray.remote(num_cpus=0)
    class Actor:
        def ready(self) -> int:
            return os.getpid()

    @ray.remote(num_cpus=0, max_calls=1)  # a new worker process for every call
    def task() -> int:
        return os.getpid()

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0,
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"ray": 100})
    cluster.add_node(num_cpus=2, resources={"meshyard": 100}, **setup_worker.ray_params())
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()

    def start(kind: str, way: str) -> float:
        settle()
        cpu0 = machine_cpu()
        if kind == "task":
            ray.get([task.options(resources={way: 1}).remote() for _ in range(args.actors)],
                    timeout=600)
            used = machine_cpu() - cpu0
        else:
            env = runtime_env() if kind == "forked" else {}
            actors = [Actor.options(resources={way: 1}, runtime_env=env).remote()
                      for _ in range(args.actors)]
            ray.get([a.ready.remote() for a in actors], timeout=600)
            used = machine_cpu() - cpu0
            for a in actors:
                ray.kill(a, no_restart=True)
        return used / args.actors

    runs: dict[str, dict[str, list[float]]] = {k: {w: [] for w in WAYS} for k in KINDS}
    try:
        for kind in KINDS:  # warm-up: each node's first workers, the fork servers' starts
            for way in WAYS:
                start(kind, way)
        for r in range(args.rounds):
            for kind in KINDS:
                for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                    runs[kind][way].append(start(kind, way))
                print(f"round {r + 1} {kind}: " + ", ".join(
                    f"{w} {runs[kind][w][-1]:.2f}" for w in WAYS) + " CPU-s a process",
                    flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    med = {k: {w: statistics.median(v[w]) for w in WAYS} for k, v in runs.items()}
    result: dict[str, Any] = {
        "processes_per_round": args.actors, "rounds": args.rounds,
        "median_cpu_s_per_process": med,
        "ratio_meshyard_to_ray": {k: m["meshyard"] / m["ray"] for k, m in med.items()},
        "runs": runs, "load": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M"),
        "python": sys.executable,
    }
    print(json.dumps({k: result[k] for k in ("median_cpu_s_per_process",
                                              "ratio_meshyard_to_ray")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
