"""What an attempt's end costs to read its ranks' files on their nodes: a Ray task pinned to
each node per read, or each node's long-lived agent (orchestrator/runtime/on_nodes.py), on
the same work in one run.

    .venv/bin/python bench/node_reads.py [--rounds 6] [--gap 5] [--out FILE.json]

One simulated cluster (ray.cluster_utils.Cluster, 127.0.0.1, its nodes started as
meshyard's are): a head with no CPUs and two nodes of 2 CPUs. A round is one attempt's end:
`read_attempt_rows` (orchestrator/runtime/metrics_files.py) on both nodes at once, through
each way in turn (alternating which goes first), `--gap` seconds apart, as attempts end
apart in a service. The figures, per round and way: the whole machine's CPU (/proc/stat,
both cores: the raylets' and the workers' included) from the first call to the last answer,
its wall time, and how many worker processes the raylets started for it (their logs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actor_fork import machine_cpu, settle  # noqa: E402 - bench/, this script's folder

WAYS = ("task", "agent")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--gap", type=float, default=5.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import tempfile

    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from orchestrator.runtime.metrics_files import read_attempt_rows
    from orchestrator.runtime.on_nodes import run_on_nodes
    from workers.host import setup_worker

    task = ray.remote(num_cpus=0, max_retries=0)(read_attempt_rows)
    run_dir = tempfile.mkdtemp(prefix="node-reads-")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, **setup_worker.ray_params()})
    for _ in range(2):
        cluster.add_node(num_cpus=2, **setup_worker.ray_params())
    ray.init(address=cluster.address, namespace="meshyard", log_to_driver=False)
    cluster.wait_for_nodes()
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")]
    work = {nid: {"run_dir": run_dir, "attempt": 1, "ranks": [0, 1]} for nid in nodes}

    def started() -> int:
        return sum(len(re.findall(r"Started worker process", f.read_text(errors="replace")))
                   for f in logs.glob("raylet*.out"))

    def read(way: str) -> dict[str, float]:
        time.sleep(args.gap)
        settle(max_s=10)
        n0, cpu0, t0 = started(), machine_cpu(), time.monotonic()
        if way == "task":
            refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                nid, soft=False)).remote(**kw) for nid, kw in work.items()]
            got = ray.get(refs, timeout=120)
        else:
            got = list(run_on_nodes(read_attempt_rows, work, timeout_s=120).values())
        wall, cpu = time.monotonic() - t0, machine_cpu() - cpu0
        assert all(isinstance(g, tuple) and g[1] == [0, 1] for g in got), got
        time.sleep(2.0)  # the raylets log the processes they started
        return {"cpu_s": cpu, "wall_s": wall, "processes": started() - n0}

    runs: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    try:
        for r in range(args.rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                runs[way].append(read(way))
            print(f"round {r + 1}: " + ", ".join(
                f"{w} {runs[w][-1]['cpu_s']:.2f} CPU-s {runs[w][-1]['wall_s']:.2f} s "
                f"{runs[w][-1]['processes']} started" for w in WAYS), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    med = {w: {k: statistics.median(x[k] for x in v) for k in ("cpu_s", "wall_s")}
           for w, v in runs.items()}
    result: dict[str, Any] = {
        "rounds": args.rounds, "gap_s": args.gap, "median_per_read": med,
        "processes_started": {w: sum(x["processes"] for x in v) for w, v in runs.items()},
        "ratio_agent_to_task": {k: med["agent"][k] / med["task"][k] for k in ("cpu_s", "wall_s")},
        "runs": runs, "load": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(json.dumps({k: result[k] for k in ("median_per_read", "processes_started",
                                              "ratio_agent_to_task")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
