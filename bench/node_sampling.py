"""What sampling a node's utilisation costs that node: meshyard's long-lived sampler actor per
node (orchestrator/runtime/node_sampling.py) vs the Ray idiom it replaces, a task pinned to the node
per sample (`ray.remote(num_cpus=0)` + NodeAffinitySchedulingStrategy).

    .venv/bin/python bench/node_sampling.py            # ~2 min; --samples N --interval-s S

On a local Ray of one node (2 CPUs) with two idle actors holding its CPUs (a node running a
job), each way takes `--samples` samples `--interval-s` apart. Reported per sample: the
machine's busy CPU-seconds above an idle window of the same length on the same cluster, the
wall time of one pass, and how many distinct processes answered. Writes
bench/results/node_sampling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from orchestrator.runtime.node_sampling import NodeSamplers  # noqa: E402
from orchestrator.runtime.nodes import TopologySource, register_nodes  # noqa: E402
from orchestrator.store import open_store  # noqa: E402
from workers.host.sampling import NodeSampler  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "node_sampling.json"


def _busy() -> float:
    """The machine's busy CPU-seconds so far (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _task_sample(node: str) -> dict[str, Any]:
    row = NodeSampler().sample(node)  # what a fresh process per sample does: a new window
    row["pid"] = os.getpid()
    return row


class _Holder:
    def ready(self) -> bool:
        return True


def _window(n: int, interval_s: float, one_pass: Any) -> dict[str, Any]:
    walls, pids = [], set()
    t0, busy0 = time.monotonic(), _busy()
    for i in range(n):
        start = time.monotonic()
        pids |= set(one_pass())
        walls.append(time.monotonic() - start)
        time.sleep(max(0.0, t0 + (i + 1) * interval_s - time.monotonic()))
    return {"busy_cpu_s": _busy() - busy0, "wall_s": time.monotonic() - t0,
            "pass_wall_s": sorted(walls)[len(walls) // 2], "first_pass_wall_s": walls[0],
            "processes": len(pids)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--interval-s", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    n, every = args.samples, args.interval_s

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        holders = [ray.remote(num_cpus=1)(_Holder).remote() for _ in range(2)]
        ray.get([h.ready.remote() for h in holders])
        node_id = ray.get_runtime_context().get_node_id()
        tmp = Path(tempfile.mkdtemp(prefix="meshyard-bench-"))
        store = open_store(f"sqlite:///{tmp / 'meshyard.db'}")
        register_nodes(store, TopologySource(cluster_file=None))
        time.sleep(5)  # let the start settle before the idle window

        idle = _window(n, every, lambda: [])

        task = ray.remote(num_cpus=0, max_retries=0)(_task_sample).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        per_task = _window(n, every, lambda: [ray.get(task.remote("head"), timeout=60)["pid"]])

        samplers = NodeSamplers()

        def actor_pass() -> list[int]:
            assert samplers.sample(store, timeout_s=60) == 1
            return list(samplers.pids().values())

        per_actor = _window(n, every, actor_pass)
        samplers.close()
        store.close()
    finally:
        ray.shutdown()

    def per_sample(w: dict[str, Any]) -> float:
        return max(0.0, w["busy_cpu_s"] - idle["busy_cpu_s"]) / n

    out = {"samples": n, "interval_s": every, "cpus": os.cpu_count(),
           "idle": idle, "task_per_sample": per_task, "meshyard_actor": per_actor,
           "cpu_s_per_sample": {"task_per_sample": per_sample(per_task),
                                "meshyard_actor": per_sample(per_actor)}}
    a, t = out["cpu_s_per_sample"]["meshyard_actor"], out["cpu_s_per_sample"]["task_per_sample"]
    out["ratio_cpu"] = t / a if a > 0 else None
    out["ratio_pass_wall"] = per_task["pass_wall_s"] / per_actor["pass_wall_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{n} samples, {every:g} s apart, one node with its CPUs held by two actors")
    for name, w in (("task per sample", per_task), ("meshyard actor", per_actor)):
        print(f"  {name:16s} {per_sample(w):6.3f} busy CPU-s per sample above idle, "
              f"pass {w['pass_wall_s'] * 1000:7.1f} ms (first {w['first_pass_wall_s']:.2f} s), "
              f"{w['processes']} processes answered")
    print(f"  idle window: {idle['busy_cpu_s']:.2f} busy CPU-s in {idle['wall_s']:.0f} s")
    ratio = f"{out['ratio_cpu']:.1f}x" if out["ratio_cpu"] else "n/a (actor at idle level)"
    print(f"  task / actor: CPU {ratio}, pass wall {out['ratio_pass_wall']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
