"""Where a test run's time went, from the timeline `make test` writes when asked:

    MESHYARD_TEST_TIMELINE=/tmp/t.jsonl make test
    .venv/bin/python bench/suite_timeline.py /tmp/t.jsonl [--top 40] [--json OUT]

Each line of the timeline is one test: its xdist worker, start and end (fixtures included) and
the machine's CPU ticks over it (tests/conftest.py); two more lines hold the machine's speed at
the run's start and end (the CPU of one process importing torch, torch._dynamo and
torch.distributed), against which runs on a faster or slower machine compare. Printed: each
worker's busy time and idle tail (the run ends when its busiest worker does), and per unit of
scheduling (an XDIST_GROUPS group or a module, as `make test` hands them out) its wall time and
an estimate of its CPU: every second of machine CPU is split evenly between the tests running
in that second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import xdist_scope  # noqa: E402


def load(path: Path) -> tuple[list[dict], dict[str, float]]:
    """The tests' lines, and the CPU-seconds of the speed probe (tests/conftest.py,
    `_timeline_speed`) at the run's `start` and `end` where the timeline has them."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]
    return ([r for r in lines if "test" in r],
            {r["speed"]: r["import_cpu_s"] for r in lines if "speed" in r})


def cpu_shares(rows: list[dict]) -> list[float]:
    """Each test's estimated CPU-seconds: its interval's machine CPU, split over the tests
    that overlapped it (weighted by how much of the interval each overlap covers)."""
    hz = os.sysconf("SC_CLK_TCK")
    out = []
    for r in rows:
        span = max(r["end"] - r["start"], 1e-6)
        others = 0.0
        for o in rows:
            if o is r:
                continue
            overlap = min(r["end"], o["end"]) - max(r["start"], o["start"])
            if overlap > 0:
                others += overlap / span
        out.append(r["ticks"] / hz / (1.0 + others))
    return out


def summary(rows: list[dict], top: int) -> dict:
    start = min(r["start"] for r in rows)
    end = max(r["end"] for r in rows)
    workers: dict[str, dict] = {}
    for r in rows:
        w = workers.setdefault(r["worker"], {"busy_s": 0.0, "last_end": 0.0, "tests": 0})
        w["busy_s"] += r["end"] - r["start"]
        w["last_end"] = max(w["last_end"], r["end"] - start)
        w["tests"] += 1
    shares = cpu_shares(rows)
    units: dict[str, dict] = defaultdict(lambda: {"wall_s": 0.0, "cpu_s": 0.0, "tests": 0})
    for r, cpu in zip(rows, shares, strict=True):
        u = units[xdist_scope(r["test"])]
        u["wall_s"] += r["end"] - r["start"]
        u["cpu_s"] += cpu
        u["tests"] += 1
        u["worker"] = r["worker"]
    ranked = sorted(units.items(), key=lambda kv: -kv[1]["cpu_s"])
    return {"wall_s": round(end - start, 1), "tests": len(rows),
            "cpu_s_estimated": round(sum(shares), 1),
            "workers": {k: {kk: round(vv, 1) if isinstance(vv, float) else vv
                            for kk, vv in v.items()} for k, v in sorted(workers.items())},
            "units": [{"unit": k, **{kk: round(vv, 1) if isinstance(vv, float) else vv
                                     for kk, vv in v.items()}} for k, v in ranked[:top]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline", type=Path)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows, speed = load(args.timeline)
    s = summary(rows, args.top)
    s["speed_probe_cpu_s"] = speed
    print(f"{s['tests']} tests, {s['wall_s']:.0f} s from the first start to the last end, "
          f"about {s['cpu_s_estimated']:.0f} CPU-s of the machine's")
    if speed:
        mean = sum(speed.values()) / len(speed)
        print("  the machine's speed: the probe (import torch, torch._dynamo, "
              "torch.distributed) took " + ", ".join(f"{v:.2f} CPU-s at the {k}"
                                                     for k, v in speed.items())
              + f"; the run's CPU is {s['cpu_s_estimated'] / mean:.0f} such imports")
    for name, w in s["workers"].items():
        print(f"  {name}: {w['tests']} tests, busy {w['busy_s']:.0f} s, "
              f"last test ended at {w['last_end']:.0f} s")
    print(f"{'CPU-s':>7} {'wall s':>7} {'tests':>5}  worker  unit")
    for u in s["units"]:
        print(f"{u['cpu_s']:7.0f} {u['wall_s']:7.0f} {u['tests']:5d}  "
              f"{u['worker']:<6}  {u['unit']}")
    if args.json:
        args.json.write_text(json.dumps(s, indent=2) + "\n")


if __name__ == "__main__":
    main()
