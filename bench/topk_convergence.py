"""Top-K gradient compression vs uncompressed DDP, per optimizer: how far each gets in the
same steps.

    .venv/bin/python bench/topk_convergence.py   # ~2.5 min on 2 cores; --steps, --seeds, --out

The tiny GPT of examples/tiny/ddp-topk.yaml (2 blocks, d_model 64, synthetic data) on 2 gloo
ranks (torchrun, one launch per seed running every spec in turn), for `--steps` steps, with:
no compression, Top-K at `--ratio` (error feedback) from the first step, Top-K after a warm
start of each `--warmup` steps (`training.ddp.topk_start_iter`), and for comparison int8
(per-tensor uint8) and PowerSGD at its defaults (rank 1, plain all-reduce for 2 steps); each
for SGD with momentum (lr 0.1) and AdamW (lr 3e-3). Per run and seed: the loss at a few
steps and the mean of the last 10; over the seeds, that mean's average and its ratio to the
uncompressed run's; the gradient bytes one rank sends per step once compressing. Writes
`bench/results/topk_convergence.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workers.host.env import free_port  # noqa: E402

MODEL = {"kind": "gpt", "n_layers": 2, "n_heads": 4, "d_model": 64, "vocab_size": 128,
         "seq_len": 32}
LR = {"sgd": 0.1, "adamw": 3e-3}
TAIL = 10  # steps averaged for the end loss (one step's loss is noisy)


def hooks(*, ratio: float, warmups: list[int]) -> dict[str, dict[str, Any]]:
    """Run label -> training.ddp: none, topk, topk after each warm-up, int8, powersgd."""
    out: dict[str, dict[str, Any]] = {"none": {}}
    for w in (0, *warmups):
        out["topk" + (f"-warm{w}" if w else "")] = {
            "comm_hook": "topk", "topk_ratio": ratio, "topk_start_iter": w}
    out["int8"] = {"comm_hook": "int8"}
    out["powersgd"] = {"comm_hook": "powersgd"}
    return out


def specs(*, steps: int, seed: int, ddp: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Run name (`<optimizer>-<hook>`) -> spec."""
    return {f"{opt}-{label}": {
        "name": f"{opt}-{label}", "parallelism": {"dp_replicate": 2}, "model": MODEL,
        "data": {"kind": "synthetic"},
        "training": {"steps": steps, "micro_batch_size": 4, "lr": lr, "optimizer": opt,
                     "seed": seed, "ddp": hook},
        "checkpoint": {"enabled": False}, "resources": {"device": "cpu"}}
        for opt, lr in LR.items() for label, hook in ddp.items()}


def launch(docs: dict[str, dict[str, Any]], tmp: Path) -> dict[str, list[dict[str, Any]]]:
    """Runs every spec in one 2-rank torchrun; name -> its metrics rows."""
    paths = []
    for name, doc in docs.items():
        paths.append(tmp / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    out = tmp / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "workers.loop.launch",
           "--out", str(out), *(a for p in paths for a in ("--spec", str(p)))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"torchrun exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return {name: [json.loads(line) for line in
                   (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
            for name in docs}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    loss = {m["step"]: m["loss"] for m in rows}
    steps = sorted(loss)
    sent = [m["grad_comm_bytes"] for m in rows if "grad_comm_bytes" in m]
    return {"loss_at": {s: round(loss[s], 4) for s in sorted({50, 100, steps[-1]} & set(loss))},
            "loss_last10": round(sum(loss[s] for s in steps[-TAIL:]) / TAIL, 4),
            "grad_bytes_per_step": sent[-1] if sent else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--ratio", type=float, default=0.1)
    ap.add_argument("--warmup", default="25,100", help="comma-separated topk_start_iter values")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (model init, data)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "topk_convergence.json"))
    args = ap.parse_args()
    ddp = hooks(ratio=args.ratio, warmups=[int(w) for w in args.warmup.split(",") if w])
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.time()
    per_seed: dict[str, dict[int, dict[str, Any]]] = {}
    for seed in seeds:
        with tempfile.TemporaryDirectory() as d:
            for name, rows in launch(specs(steps=args.steps, seed=seed, ddp=ddp),
                                     Path(d)).items():
                per_seed.setdefault(name, {})[seed] = summarize(rows)
    results: dict[str, dict[str, Any]] = {}
    for name, by_seed in per_seed.items():
        mean = sum(r["loss_last10"] for r in by_seed.values()) / len(by_seed)
        results[name] = {"loss_last10_mean": round(mean, 4), "seeds": by_seed,
                         "grad_bytes_per_step": by_seed[seeds[0]]["grad_bytes_per_step"]}
    for name, r in results.items():
        base = results[name.split("-")[0] + "-none"]["loss_last10_mean"]
        r["vs_uncompressed"] = round(r["loss_last10_mean"] / base, 2)
    doc = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "steps": args.steps,
           "seeds": seeds, "topk_ratio": args.ratio, "lr": LR, "model": MODEL, "ranks": 2,
           "wall_s": round(time.time() - t0, 1), "runs": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'run':22} {'last-10 loss per seed':>24} {'mean':>7} {'/ none':>7}")
    for name, r in results.items():
        each = " ".join(f"{s['loss_last10']:.3f}" for s in r["seeds"].values())
        print(f"{name:22} {each:>24} {r['loss_last10_mean']:7.3f} {r['vs_uncompressed']:7.2f}")
    print(f"wrote {args.out} ({doc['wall_s']} s)")


if __name__ == "__main__":
    main()
