"""Throughput: meshyard's training loop vs a minimal hand-written torchrun loop, one run.

    .venv/bin/python bench/throughput.py [--steps 60] [--warmup 10] [--rounds 5]

Same model (the built-in GPT), same global batch, same DDP config (2 ranks, dp_replicate=2,
25 MiB buckets, AdamW, grad clip 1.0), same launcher (torchrun, OMP_NUM_THREADS=1 per rank):

* ``baseline``  bench/ddp_baseline.py — what a user writes by hand;
* ``meshyard``  ``workers.loop.launch`` under torchrun with the default 1 s heartbeat (through
  bench/launch_cputime.py, which only adds rank 0's CPU time to each metrics row);
* ``meshyard_no_hb``  the same with the heartbeat thread effectively off (1e6 s interval).

Two figures per run; the three alternate (order reversed every other round) for ``--rounds``
rounds, and each ratio is the median of the per-round ratios:

* wall: steps/s = 1 / the median step duration after ``--warmup`` steps, from the wall clock
  recorded at the end of every step (the same point in both loops);
* cpu: rank 0's mean CPU seconds per step over the same steps (``time.process_time()``, all
  threads, so the heartbeat thread counts; the mean, so the loop's sync steps count). On a
  shared machine this is the robust figure: other processes stretch wall time, much less
  CPU time.

Then DDP, FSDP (dp_shard=2), TP (tp=2) and PP (pp=2, 1F1B, 4 microbatches) run on the same
model and global batch, reported relative to DDP; so do DDP with the int8 and Top-K (1%)
comm hooks. The MoE variant of the model (4 experts, top-2) runs under DDP and under expert
parallel (ep=2), EP reported relative to that MoE DDP; context parallel (cp=2, vs DDP on the
same model) only with two CUDA GPUs (CP is CUDA only). Heartbeat overhead is given end to end
(``meshyard`` vs ``meshyard_no_hb``) and computed from a microbenchmark of one heartbeat and
one phase change. With at least two CUDA GPUs the runs use them and the report adds MFU.
Writes bench/results/throughput.json; ``--rounds 0`` skips the baseline comparison and
runs only the layouts (``--layouts a,b``), written to bench/results/throughput_layouts.json.
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

import yaml

from workers.host.env import free_port

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "throughput.json"
LAYOUT_RESULTS = REPO / "bench" / "results" / "throughput_layouts.json"
MODEL: dict[str, Any] = {"kind": "gpt", "n_layers": 4, "n_heads": 4, "d_model": 128,
                         "vocab_size": 256, "seq_len": 64}
GLOBAL_BATCH = 16
SEED = 0
LR = 3e-3
GRAD_CLIP = 1.0
BUCKET_MB = 25.0
# Parallel layouts on 2 ranks; micro_batch_size keeps the global batch at GLOBAL_BATCH.
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {"dp_replicate": 2},
    "fsdp": {"dp_shard": 2},
    "tp": {"tp": 2},
    "pp": {"pp": 2, "pp_schedule": "1f1b", "pp_microbatches": 4},
    "ddp_int8": {"dp_replicate": 2},
    "ddp_topk": {"dp_replicate": 2},
    "ddp_moe": {"dp_replicate": 2},
    "ep": {"ep": 2},
    "cp": {"cp": 2},
}
MOE = {"experts": 4, "top_k": 2, "capacity_factor": 1.25}
# Layout -> (model changes, DDP options, the layout its rate is relative to).
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "ddp_int8": ({}, {"comm_hook": "int8"}, "ddp"),
    "ddp_topk": ({}, {"comm_hook": "topk", "topk_ratio": 0.01}, "ddp"),
    "ddp_moe": ({"moe": MOE}, {}, "ddp"),
    "ep": ({"moe": MOE}, {}, "ddp_moe"),
}
CUDA_ONLY = ("cp",)
# Dense peak FLOP/s per GPU by precision (vendor datasheets, SXM parts), for MFU.
PEAK_FLOPS = {
    "H200": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12},
    "H100": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},
}


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _torchrun(args: list[str], *, nproc: int) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                          check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")


def spec_for(layout: str, *, steps: int, device: str) -> dict[str, Any]:
    par = LAYOUTS[layout]
    # Expert-parallel ranks read their own data; CP ranks share a batch.
    dp = par.get("dp_replicate", 1) * par.get("dp_shard", 1) * par.get("ep", 1)
    model_changes, ddp, _ = VARIANTS.get(layout, ({}, {}, "ddp"))
    return {
        "name": f"bench-{layout}", "parallelism": par, "model": {**MODEL, **model_changes},
        "data": {"kind": "synthetic"},
        "training": {"steps": steps, "micro_batch_size": GLOBAL_BATCH // dp, "lr": LR,
                     "grad_clip": GRAD_CLIP, "seed": SEED,
                     "ddp": {"bucket_cap_mb": BUCKET_MB, **ddp}},
        "checkpoint": {"enabled": False},
        "resources": {"device": device},
    }


def run_meshyard(layout: str, *, steps: int, device: str, work: Path, nproc: int,
                 hb_interval: float = 1.0) -> tuple[list[float], list[float]]:
    d = Path(tempfile.mkdtemp(prefix=f"{layout}-", dir=work))
    spec = d / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_for(layout, steps=steps, device=device)))
    _torchrun([str(REPO / "bench" / "launch_cputime.py"), "--spec", str(spec),
               "--out", str(d / "run"), "--heartbeat-interval", str(hb_interval)], nproc=nproc)
    rows = [json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines() if x]
    return [r["time"] for r in rows], [r["cpu_time"] for r in rows]


def run_baseline(*, steps: int, device: str, work: Path,
                 nproc: int) -> tuple[list[float], list[float]]:
    d = Path(tempfile.mkdtemp(prefix="baseline-", dir=work))
    cfg = {"model": {k: v for k, v in MODEL.items() if k != "kind"}, "steps": steps,
           "micro_batch_size": GLOBAL_BATCH // nproc, "lr": LR, "grad_clip": GRAD_CLIP,
           "bucket_cap_mb": BUCKET_MB, "seed": SEED, "device": device}
    (d / "config.json").write_text(json.dumps(cfg))
    _torchrun([str(REPO / "bench" / "ddp_baseline.py"), "--config", str(d / "config.json"),
               "--out", str(d / "times.json")], nproc=nproc)
    out = json.loads((d / "times.json").read_text())
    return list(out["times"]), list(out["cpu"])


def median_step(clock: list[float], *, warmup: int) -> float:
    """Median per-step increment of ``clock`` (wall or CPU seconds) after ``warmup`` steps.

    The median, not the mean over the window: on a shared machine another process's burst
    stretches a few steps by several times, and the median ignores those.
    """
    if len(clock) <= warmup + 2:
        raise ValueError(f"need more than {warmup + 2} steps, got {len(clock)}")
    steady = clock[warmup:]
    return statistics.median(b - a for a, b in zip(steady, steady[1:], strict=False))


def steady_rate(times: list[float], *, warmup: int) -> float:
    """Steady-state steps/s: 1 / the median step duration."""
    return 1.0 / median_step(times, warmup=warmup)


def heartbeat_microbench() -> dict[str, float]:
    """Cost of one heartbeat (Flight Recorder status read + Heartbeat object) and of one
    phase change, in a 1-process gloo group with the Flight Recorder on, as in a job."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist

    from workers.loop.callbacks import Phase
    from workers.loop.heartbeat import Progress, make_heartbeat

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        for _ in range(50):
            dist.all_reduce(torch.ones(4))
        progress = Progress()
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            make_heartbeat(progress, rank=0)
        beat = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for i in range(n):
            progress.enter(Phase.FORWARD if i % 2 else Phase.BACKWARD, i)
        enter = (time.perf_counter() - t0) / n
    finally:
        dist.destroy_process_group()
    return {"heartbeat_s": beat, "phase_change_s": enter}


def flops_per_token() -> float:
    """6 N (dense matmuls, forward + backward) + attention scores 12 L d T."""
    d, layers, v, t = MODEL["d_model"], MODEL["n_layers"], MODEL["vocab_size"], MODEL["seq_len"]
    n_params = layers * 12 * d * d + v * d  # blocks (4d^2 attn + 8d^2 MLP) + LM head
    return 6 * n_params + 12 * layers * d * t


def mfu(steps_per_s: float, *, n_gpus: int) -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    peaks = next((p for key, p in PEAK_FLOPS.items() if key in name), None)
    if peaks is None:
        return None
    prec = torch.get_float32_matmul_precision()
    peak = peaks["fp32" if prec == "highest" else "tf32"]
    achieved = steps_per_s * GLOBAL_BATCH * MODEL["seq_len"] * flops_per_token()
    return achieved / (peak * n_gpus)


def mean_step(clock: list[float], *, warmup: int) -> float:
    """Mean per-step increment of ``clock`` after ``warmup`` steps (for CPU time, which other
    processes barely stretch: the mean counts the loop's sync steps, which cost more than
    the steps between them, where a median would skip them)."""
    if len(clock) <= warmup + 2:
        raise ValueError(f"need more than {warmup + 2} steps, got {len(clock)}")
    return (clock[-1] - clock[warmup]) / (len(clock) - 1 - warmup)


def _measure(run: Any, *, steps: int, warmup: int) -> tuple[float, float]:
    """(wall-clock steps/s, rank 0's mean CPU seconds per step).

    CPU time moves much less than wall time when other processes share the cores: a rank
    waiting for its peer sleeps in gloo and a descheduled one accrues nothing.
    """
    times, cpu = run(steps)
    return steady_rate(times, warmup=warmup), mean_step(cpu, warmup=warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help="comma-separated layouts to compare (ddp always runs)")
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.device_count() >= 2
    device, nproc = ("cuda" if cuda else "cpu"), 2
    work = Path(tempfile.mkdtemp(prefix="meshyard-throughput-"))
    kw: dict[str, Any] = {"device": device, "work": work, "nproc": nproc}
    runs: dict[str, Any] = {
        "baseline": lambda n: run_baseline(steps=n, **kw),
        "meshyard": lambda n: run_meshyard("ddp", steps=n, **kw),
        "meshyard_no_hb": lambda n: run_meshyard("ddp", steps=n, hb_interval=1e6, **kw),
    }
    m = {"steps": args.steps, "warmup": args.warmup}
    names = ["ddp", *[n for n in args.layouts.split(",") if n and n != "ddp"]]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        raise SystemExit(f"unknown layouts {unknown}; choose from {list(LAYOUTS)}")
    names = [n for n in names if cuda or n not in CUDA_ONLY]
    for name in names:  # a layout's peer runs too
        peer = VARIANTS.get(name, ({}, {}, "ddp"))[2]
        if peer not in names:
            names.insert(names.index(name), peer)
    if args.rounds == 0:
        layouts = {name: _measure(lambda n, name=name: run_meshyard(name, steps=n, **kw), **m)
                   for name in names}
        result = {"config": {"model": MODEL, "moe": MOE, "global_batch": GLOBAL_BATCH,
                             "ranks": nproc, "device": device, "steps": args.steps,
                             "warmup": args.warmup, "load_average": os.getloadavg()},
                  **_layout_report(layouts)}
        LAYOUT_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        LAYOUT_RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds):
        # Alternate the order too, so a load trend does not favour whoever runs first.
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            run = runs[name]
            w, c = _measure(run, **m)
            wall[name].append(w)
            cpu[name].append(c)
        print(f"round {r + 1}: " + ", ".join(
            f"{k} {wall[k][-1]:.2f} steps/s {cpu[k][-1] * 1e3:.0f} cpu-ms/step" for k in runs),
            flush=True)
    layouts = {name: _measure(lambda n, name=name: run_meshyard(name, steps=n, **kw), **m)
               for name in names}
    result = _report(args, wall=wall, cpu=cpu, layouts=layouts, device=device, nproc=nproc,
                     cuda=cuda)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("wall", "cpu", "heartbeat", "relative_to_ddp",
                                             "mfu")}, indent=2))


def _median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def _layout_report(layouts: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Each layout's rates, and relative to its peer (DDP on the same model)."""
    out: dict[str, Any] = {}
    for k, (w, c) in layouts.items():
        if k == "ddp":
            continue
        peer = VARIANTS.get(k, ({}, {}, "ddp"))[2]
        pw, pc = layouts[peer]
        out[k] = {"relative_to": peer, "wall": w / pw, "cpu": pc / c}
    return {"layouts": {k: {"steps_per_s": w, "cpu_s_per_step": c}
                        for k, (w, c) in layouts.items()},
            "relative_to_ddp": out}


def _report(args: argparse.Namespace, *, wall: dict[str, list[float]],
            cpu: dict[str, list[float]], layouts: dict[str, tuple[float, float]], device: str,
            nproc: int, cuda: bool) -> dict[str, Any]:
    med_w = {k: statistics.median(v) for k, v in wall.items()}
    med_c = {k: statistics.median(v) for k, v in cpu.items()}
    micro = heartbeat_microbench()
    step_s = 1.0 / med_w["meshyard"]
    # One heartbeat per second of training (1 s default interval) plus ~5 phase changes per
    # step (data, forward, backward, optimizer, checkpoint).
    computed_hb = micro["heartbeat_s"] / 1.0 + 5 * micro["phase_change_s"] / step_s
    return {
        "config": {"model": MODEL, "global_batch": GLOBAL_BATCH, "ranks": nproc,
                   "device": device, "steps": args.steps,
                   "warmup": args.warmup, "rounds": args.rounds, "bucket_cap_mb": BUCKET_MB,
                   "grad_clip": GRAD_CLIP, "load_average": os.getloadavg()},
        # Ratios are the median of per-round ratios: the two runs of a round ran minutes
        # apart at most, under similar load.
        "wall": {"steps_per_s": med_w, "per_round": wall,
                 "ratio_meshyard_vs_baseline": _median_ratio(wall["meshyard"],
                                                             wall["baseline"])},
        "cpu": {"cpu_s_per_step": med_c, "per_round": cpu,
                # Less CPU per step is faster: baseline / meshyard is the throughput ratio.
                "ratio_meshyard_vs_baseline": _median_ratio(cpu["baseline"],
                                                            cpu["meshyard"])},
        "heartbeat": {
            "end_to_end_overhead_wall": 1.0 - _median_ratio(wall["meshyard"],
                                                             wall["meshyard_no_hb"]),
            "end_to_end_overhead_cpu": _median_ratio(cpu["meshyard"],
                                                     cpu["meshyard_no_hb"]) - 1.0,
            "computed_overhead": computed_hb, **micro},
        **_layout_report(layouts),
        "mfu": ({"meshyard_ddp": mfu(med_w["meshyard"], n_gpus=nproc),
                 "baseline": mfu(med_w["baseline"], n_gpus=nproc)} if cuda else None),
        "flops_per_token": flops_per_token(),
    }


if __name__ == "__main__":
    main()
