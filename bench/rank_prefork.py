"""What a user-code rank costs a forked worker actor: its rank process started cold, or the one
the fork server forked with the worker (meshyard/_prestart.py `serve_preforked`).

    .venv/bin/python bench/rank_prefork.py [--rounds 6] [--out bench/results/rank_prefork.json]

Without Ray: each round runs, through workers/host/forkserver_client.py as the raylet runs
it, a stand-in worker forked by the fork server (one server for the whole run; its start is a
warm-up round of its own), twice, alternating which goes first:

  * cold      — the worker starts the rank as an actor without a prestarted process does:
                `RankProcess([python, -m, meshyard.runner, script, rank.py]).start()`; the
                client asks for no rank process (MESHYARD_FORK_RANK=0);
  * preforked — the client asks for one (MESHYARD_FORK_RANK=1); the worker takes it
                (`PrestartedRank.preforked()`) and hands it the same argv (`hand`).

The rank then does what a small DDP script does before and at its first step: imports torch
and torch.distributed, joins a one-rank gloo group, wraps an MLP in DistributedDataParallel
(torch._dynamo), one forward, backward and AdamW step, exits. Figures per round: the wall time
from the worker's decision to start the rank to the rank's exit; the CPU of the rank process
(the worker's RUSAGE_CHILDREN) and of the worker itself (RUSAGE_SELF: the fork of the rank
process counts here); and the whole machine's CPU over the round (/proc/stat: the client,
the server's fork of the worker, everything).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rank_fork import DDP_STEP  # noqa: E402
from workers.host import forkserver_client as client  # noqa: E402

RANK = """
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1,
                        timeout=timedelta(seconds=60))
""" + DDP_STEP

WORKER = """
import json, os, resource, sys, time
from pathlib import Path
from workers.host.rankproc import PrestartedRank, RankProcess
out = Path(os.environ["BENCH_DIR"])
argv = [sys.executable, "-m", "meshyard.runner", "script", str(out / "rank.py")]
env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", "HOME": os.environ["HOME"]}
t0 = time.perf_counter()
if os.environ["BENCH_MODE"] == "preforked":
    pre = PrestartedRank.preforked()
    proc = pre.hand(argv, env=env, cwd=str(out), stdout=out / "stdout",
                    stderr=out / "stderr") if pre is not None else None
    if proc is None:
        sys.exit("no preforked rank process to hand the rank to")
else:
    proc = RankProcess(argv, env=env, cwd=str(out)).start()
rc = proc.wait(300)
wall = time.perf_counter() - t0
kids, me = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rc": rc, "wall_s": wall, "rank_cpu_s": kids.ru_utime + kids.ru_stime,
                  "worker_cpu_s": me.ru_utime + me.ru_stime}), flush=True)
"""


def _machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return (int(fields[1]) + int(fields[2]) + int(fields[3])) / os.sysconf("SC_CLK_TCK")


def one(mode: str, *, temp: Path, work: Path) -> dict[str, Any]:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "PYTHONPATH": str(ROOT), "BENCH_MODE": mode, "BENCH_DIR": str(work),
           client.RANK_VAR: "1" if mode == "preforked" else "0"}
    c0 = _machine_cpu_s()
    p = subprocess.run([sys.executable, "-I", "-S", client.__file__,
                        str(work / "default_worker.py"), f"--temp-dir={temp}"],
                       env=env, capture_output=True, text=True, timeout=600, check=False)
    machine = _machine_cpu_s() - c0
    if p.returncode != 0 or "no fork server" in p.stderr:
        raise RuntimeError(f"{mode}: exit {p.returncode}: {p.stderr[-2000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    if got["rc"] != 0:
        err = (work / "stderr").read_text()[-2000:] if mode == "preforked" else p.stderr[-2000:]
        raise RuntimeError(f"{mode}: the rank exited {got['rc']}: {err}")
    got["machine_cpu_s"] = machine
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    load_before = os.getloadavg()[0]
    temp = Path(tempfile.mkdtemp(prefix="meshyard-prefork-", dir="/tmp"))
    work = temp / "work"
    work.mkdir()
    (work / "rank.py").write_text(RANK)
    (work / "default_worker.py").write_text(WORKER)
    try:
        warm = one("cold", temp=temp, work=work)  # starts the server (its torch import)
        runs: dict[str, list[dict[str, Any]]] = {"cold": [], "preforked": []}
        for i in range(args.rounds):
            for mode in (("cold", "preforked") if i % 2 == 0 else ("preforked", "cold")):
                runs[mode].append(one(mode, temp=temp, work=work))
                time.sleep(1.0)
    finally:
        sock = Path(client.socket_path(str(temp), python=sys.executable))
        sock.unlink(missing_ok=True)  # the server sees its socket gone and exits
        time.sleep(2.0)
        for f in sorted(temp.rglob("*"), reverse=True):
            f.unlink() if not f.is_dir() else f.rmdir()
        temp.rmdir()

    def med(mode: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[mode]), 3)

    keys = ("wall_s", "rank_cpu_s", "worker_cpu_s", "machine_cpu_s")
    out: dict[str, Any] = {"rounds": args.rounds, "cpus": os.cpu_count(),
                           "warm_up_round": warm, "runs": runs}
    for mode in ("cold", "preforked"):
        out[mode] = {k: med(mode, k) for k in keys}
    for k in keys:
        out[f"{k}_ratio_cold_over_preforked"] = round(
            out["cold"][k] / max(out["preforked"][k], 1e-3), 1)
    out["load_1min_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    for mode in ("cold", "preforked"):
        m = out[mode]
        print(f"{mode:>9}: {m['wall_s']:.3f} s to the rank's exit, rank {m['rank_cpu_s']:.3f} "
              f"CPU-s, worker {m['worker_cpu_s']:.3f}, machine {m['machine_cpu_s']:.3f} "
              f"(median of {args.rounds})")
    print("cold / preforked: " + ", ".join(
        f"{k} {out[f'{k}_ratio_cold_over_preforked']}x" for k in keys))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
