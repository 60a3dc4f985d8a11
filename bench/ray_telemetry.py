"""What Ray's own telemetry costs a simulated cluster: on, as Ray ships, and off, as the test
suite runs its clusters (tests/conftest.py), on the same work in one run.

    .venv/bin/python bench/ray_telemetry.py [--rounds 2] [--seconds 40] [--out FILE.json]

Ray's telemetry here is three things: each worker's metrics exported to its node's agent
(RAY_enable_metrics_collection), each worker's task events sent to the GCS every second
(RAY_task_events_report_interval_ms), and each node agent's node and worker stats every 5 s
(REPORTER_UPDATE_INTERVAL_MS). Nothing in meshyard reads any of them.

Each round starts the test suite's runtime cluster (ray.cluster_utils.Cluster: a head of 1
CPU, two nodes of 2 CPUs and 2 fake GPUs, one of 2 CPUs) in a child process, once with
Ray's defaults and once with the three set as the suite sets them (alternating which goes
first), starts six actors, then for `--seconds` calls each actor and runs four tasks every
0.2 s. The figure is the CPU of the child's process tree over that window (the driver, GCS,
raylets, agents and workers: psutil's utime+stime of each process, before and after), by
process name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OFF = {"RAY_enable_metrics_collection": "0", "RAY_task_events_report_interval_ms": "0",
       "REPORTER_UPDATE_INTERVAL_MS": "60000"}


def child(seconds: float) -> dict[str, float]:
    """One cluster, one measured window; the CPU-seconds by process name."""
    import psutil
    import ray

    sys.path.insert(0, str(ROOT))
    from tests.integration.runtime.conftest import package_cluster

    with package_cluster():
        @ray.remote(num_cpus=0)
        class Echo:
            def call(self, i: int) -> int:
                time.sleep(0.01)
                return i

        @ray.remote(num_cpus=0)
        def task(i: int) -> int:
            time.sleep(0.01)
            return i

        actors = [Echo.remote() for _ in range(6)]
        ray.get([a.call.remote(0) for a in actors])

        def sample() -> dict[int, tuple[str, float]]:
            me = psutil.Process()
            out = {0: ("driver", sum(me.cpu_times()[:2]))}
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    out[p.pid] = (p.name(), sum(p.cpu_times()[:2]))
            return out

        before, t0 = sample(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            ray.get([a.call.remote(1) for a in actors] + [task.remote(1) for _ in range(4)])
            time.sleep(0.2)
        after = sample()
        by: dict[str, float] = {}
        for pid, (name, cpu) in after.items():
            by[name] = by.get(name, 0.0) + cpu - before.get(pid, (name, 0.0))[1]
        return by


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--out", type=Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.seconds)))
        return 0
    base = {k: v for k, v in os.environ.items() if k not in OFF}
    base.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_prestart_worker_first_driver="0",
                RAY_enable_worker_prestart="0")
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for way in (("on", "off") if r % 2 == 0 else ("off", "on")):
            env = {**base, **(OFF if way == "off" else {})}
            out = subprocess.run([sys.executable, __file__, "--child", "--seconds",
                                  str(args.seconds)], env=env, capture_output=True, text=True,
                                 timeout=args.seconds + 300, cwd=ROOT)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            got = json.loads(out.stdout.strip().splitlines()[-1])
            runs[way].append(got)
            print(f"round {r + 1} {way:3s}: {sum(got.values()):6.2f} CPU-s  " + "  ".join(
                f"{k} {v:.2f}" for k, v in sorted(got.items(), key=lambda kv: -kv[1])),
                flush=True)
            time.sleep(3)
    med = {way: statistics.median(sum(g.values()) for g in got) for way, got in runs.items()}
    result: dict[str, Any] = {"seconds": args.seconds, "rounds": args.rounds, "runs": runs,
                              "median_cpu_s": med, "off_over_on": med["off"] / med["on"]}
    print(f"median over {args.rounds} rounds of {args.seconds:.0f} s: on {med['on']:.2f} CPU-s,"
          f" off {med['off']:.2f} CPU-s, off/on {result['off_over_on']:.2f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
