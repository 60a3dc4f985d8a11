"""Two CPython builds on the same work, interleaved in one run. The interpreter a virtual
environment is made from (Makefile, PYTHON) sets the CPU that every Python process of the
service and of a test run spends: rank processes, Ray's worker processes and daemons, the CLI,
pytest.

    .venv/bin/python bench/interpreter.py --python A/bin/python --python B/bin/python [--rounds 5]

Each interpreter must be a venv with the project installed (torch, ray, pytest). Every round
starts, for each interpreter in turn, one fresh process per case and takes its user + system
CPU from `os.wait4`:

- `torch`: `import torch, torch._dynamo, torch.distributed` (what a rank process imports);
- `ray`: `import ray` (every Ray worker process and driver);
- `python`: a pure-Python loop (dict updates, str formatting, a sort);
- `collect`: `pytest --collect-only` of tests/unit (imports, assertion rewriting, the
  project's modules).

Prints per case the median CPU-seconds of each interpreter and the ratio B / A; writes
bench/results/interpreter.json. How each interpreter was built is reported too: its version,
its compiler, and whether libpython is a shared library mapped into the process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = """
d = {}
for i in range(3_000_000):
    d[i % 1000] = d.get(i % 1000, 0) + i
s = sorted(str(x) for x in range(300_000))
"""
CASES = {
    "torch": ["-c", "import torch, torch._dynamo, torch.distributed"],
    "ray": ["-c", "import ray"],
    "python": ["-c", LOOP],
    "collect": ["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                "tests/unit"],
}
DESCRIBE = """
import json, platform, sys
maps = open("/proc/self/maps").read()
print(json.dumps({"version": sys.version.split()[0], "compiler": platform.python_compiler(),
                  "executable": sys.executable, "base": sys.base_prefix,
                  "libpython_shared": "libpython" in maps}))
"""


def cpu_of(python: str, case: str) -> float:
    """The CPU-seconds (user + system) of one fresh run of `case` under `python`, in the
    checkout."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([python, *CASES[case]], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"case {case!r} failed under {python}: run it by hand to see why")
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", required=True,
                    help="an interpreter of a venv with the project installed; give two")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "interpreter.json")
    args = ap.parse_args()
    if len(args.python) != 2:
        ap.error("give --python twice: A (the baseline) and B")
    if not 1 <= args.rounds <= 50:
        ap.error("--rounds is 1..50")
    pythons = args.python
    builds = [json.loads(subprocess.run([p, "-c", DESCRIBE], capture_output=True, text=True,
                                        check=True).stdout) for p in pythons]
    samples: dict[str, list[list[float]]] = {c: [[], []] for c in CASES}
    for r in range(args.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)  # alternate who goes first
        for case in CASES:
            for i in order:
                samples[case][i].append(cpu_of(pythons[i], case))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows = {}
    for case, (a, b) in samples.items():
        ma, mb = statistics.median(a), statistics.median(b)
        rows[case] = {"a_cpu_s": round(ma, 3), "b_cpu_s": round(mb, 3),
                      "ratio_b_over_a": round(mb / ma, 3), "a_samples": a, "b_samples": b}
    for name, build in zip("AB", builds, strict=True):
        print(f"{name}: {build['executable']} (base {build['base']}), Python {build['version']}, "
              f"{build['compiler']}, libpython shared: {build['libpython_shared']}")
    print(f"{'case':8s} {'A CPU-s':>8s} {'B CPU-s':>8s} {'B / A':>6s}")
    for case, row in rows.items():
        print(f"{case:8s} {row['a_cpu_s']:8.2f} {row['b_cpu_s']:8.2f} {row['ratio_b_over_a']:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"a": builds[0], "b": builds[1], "rounds": args.rounds,
                                    "loadavg": os.getloadavg(), "cases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
