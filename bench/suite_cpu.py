"""Whole-machine CPU of one command, most often a pytest run of one test module.

    .venv/bin/python bench/suite_cpu.py [--label NAME] [--json FILE] -- CMD ARGS...

Two figures:

* the machine's: /proc/stat before and after, user+sys (and nice) CPU-seconds in between.
  Ray's processes are detached from the command (raylet, GCS, workers started by them), so
  the command's own rusage (`/usr/bin/time`) misses most of a Ray test's CPU; the machine's
  counters include it, and everything else running at the same time: on a shared machine
  this is an upper bound for the command (on a saturated machine, about cores x wall).
* the command's process tree's, Ray's included: the command runs with a tag in its
  environment (SUITE_CPU_TAG), which every process it starts inherits (Ray's head, raylets
  and workers too); a sampler reads /proc every `--interval` seconds and sums, per tagged
  process, the last utime+stime it saw. The CPU a process spends after its last sample is
  missed, so this is a lower bound; other users' processes are not in it.

The machine's load average before and after is printed so a reader can judge how quiet it
was.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
import uuid

TAG = "SUITE_CPU_TAG"


def _cpu_ticks() -> dict[str, int]:
    """The aggregate `cpu` line of /proc/stat, in clock ticks."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {n: int(v) for n, v in zip(names, fields[1:9], strict=True)}


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class TreeSampler:
    """Last seen utime+stime (ticks) of every process whose environment holds the tag."""

    def __init__(self, tag: str, interval_s: float) -> None:
        self.needle = f"{TAG}={tag}".encode()
        self.interval_s = interval_s
        self.seen: dict[tuple[int, int], int] = {}  # (pid, start time) -> ticks
        self.names: dict[tuple[int, int], str] = {}  # its command line, shortened
        self.not_tagged: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        me = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                key = (int(name), int(fields[19]))  # pid, start time: pids are reused
                if key in self.not_tagged:
                    continue
                if key not in self.seen:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        if self.needle not in f.read():
                            self.not_tagged.add(key)
                            continue
                    self.names[key] = _kind(name)
                self.seen[key] = int(fields[11]) + int(fields[12])  # utime + stime
            except (OSError, IndexError, ValueError):
                continue  # gone, or not ours to read

    @property
    def processes(self) -> int:
        return len(self.seen)

    def cpu_s(self, hz: int) -> float:
        return sum(self.seen.values()) / hz

    def by_kind(self, hz: int) -> dict[str, list[float]]:
        """Kind of process -> [CPU-s, processes], most CPU first."""
        out: dict[str, list[float]] = {}
        for key, ticks in self.seen.items():
            row = out.setdefault(self.names.get(key, "?"), [0.0, 0])
            row[0] += ticks / hz
            row[1] += 1
        return {k: [round(v[0], 1), int(v[1])]
                for k, v in sorted(out.items(), key=lambda kv: -kv[1][0])}


def _kind(pid: str) -> str:
    """A short name for a process: Ray's workers by their title (ray::WorkerActor,
    ray::IDLE), Python by its script or module, others by their executable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    if argv[0].startswith("ray::"):
        return argv[0].split()[0][:40]
    exe = os.path.basename(argv[0])
    if exe.startswith("python"):
        rest = [a for a in argv[1:] if not a.startswith("-")]
        if "-m" in argv[1:3]:
            return f"python -m {argv[argv.index('-m') + 1]}"[:60]
        return f"python {os.path.basename(rest[0]) if rest else ''}"[:60]
    return exe[:40]


def measure(cmd: list[str], *, interval_s: float = 0.25) -> dict[str, object]:
    hz = os.sysconf("SC_CLK_TCK")
    tag = uuid.uuid4().hex
    sampler = TreeSampler(tag, interval_s)
    load_before = _loadavg()
    before, t0 = _cpu_ticks(), time.monotonic()
    sampler.start()
    rc = subprocess.call(cmd, env={**os.environ, TAG: tag})
    after, wall = _cpu_ticks(), time.monotonic() - t0
    sampler.stop()
    d = {k: (after[k] - before[k]) / hz for k in before}
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cmd": cmd,
        "rc": rc,
        "wall_s": round(wall, 1),
        "machine_cpu_s": round(d["user"] + d["nice"] + d["system"], 1),
        "machine_user_s": round(d["user"] + d["nice"], 1),
        "machine_sys_s": round(d["system"], 1),
        "machine_idle_s": round(d["idle"] + d["iowait"], 1),
        "cmd_rusage_cpu_s": round(child.ru_utime + child.ru_stime, 1),
        "tree_cpu_s": round(sampler.cpu_s(hz), 1),
        "tree_processes": sampler.processes,
        "tree_by_kind": sampler.by_kind(hz),
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": _loadavg(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    ap.add_argument("--interval", type=float, default=0.25,
                    help="seconds between samples of the process tree")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command")
    result = {"label": args.label, **measure(cmd, interval_s=args.interval)}
    print(f"[suite_cpu] {args.label or ' '.join(cmd)}: rc {result['rc']}, "
          f"wall {result['wall_s']} s, machine user+sys {result['machine_cpu_s']} CPU-s "
          f"(of {result['cores']} cores x {result['wall_s']} s), its process tree "
          f"{result['tree_cpu_s']} CPU-s ({result['tree_processes']} processes), its own "
          f"rusage {result['cmd_rusage_cpu_s']} CPU-s, load {result['load_before']} -> "
          f"{result['load_after']}", file=sys.stderr)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    return int(result["rc"])  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
