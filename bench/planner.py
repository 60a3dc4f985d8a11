"""Planner benchmark.

    .venv/bin/python bench/planner.py                 # ~5 min on 2 busy cores
    .venv/bin/python bench/planner.py --skip-runs     # planning time + memory check only

1. Planning time for a 405B-class model (Llama 3 405B sizes, 2,048 sequences of 8,192
   tokens) on a declared 2,048-node x 8-GPU NVSwitch cluster (leaf = 32 nodes, spine = 16
   leaves): the declared document is parsed once (timed apart), then `plan()` runs --repeats
   times; median wall and CPU time. Target: under 2 s.
2. The tiny models of examples/tiny/: each spec's configuration is costed by the planner
   (`evaluate`) on this machine's figures -- per-rank FLOP/s from a timed fp32 matmul, shared
   by the ranks when there are more ranks than cores, and link figures from a 2-process gloo
   calibration (the same as `meshyard calibrate`) -- then run for real with torchrun
   (--steps, median step time of the steps after the first two). Spearman rank correlation
   between predicted and measured step times.
3. The measured peak RSS of a GPT-2-size reference run vs the memory estimate (the check of
   tests/integration/test_calibrate_memory.py, with the numbers).

Writes bench/results/planner.json.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.planner.calibration.figures import figures_from  # noqa: E402
from orchestrator.planner.calibration.fit import Row, fit_by_class  # noqa: E402
from orchestrator.planner.memory import (  # noqa: E402
    KNOWN_MODELS,
    MemoryConfig,
    ModelShape,
    memory_per_gpu,
)
from orchestrator.planner.planner import (  # noqa: E402
    Candidate,
    Hardware,
    PlanRequest,
    Rejection,
    evaluate,
    layout_for,
    plan,
)
from orchestrator.topology.declared import parse_cluster_doc  # noqa: E402
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology  # noqa: E402

PY = sys.executable


def big_cluster_doc(nodes: int = 2048) -> dict[str, Any]:
    return {"levels": ["leaf", "spine"], "defaults": {"gpus": 8, "intra_node": "nvswitch"},
            "nodes": [{"name": f"dgx-{i:05d}",
                       "labels": {"leaf": f"leaf-{i // 32}", "spine": f"spine-{i // 512}"}}
                      for i in range(nodes)]}


def planning_time(repeats: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    cluster = parse_cluster_doc(big_cluster_doc())
    parse_s = time.perf_counter() - t0
    req = PlanRequest(model=KNOWN_MODELS["llama-405b"], global_batch=2048,
                      hardware=Hardware(memory_gb=80, peak_tflops=989))
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        result = plan(cluster, req)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    assert result is not None
    top = result.plans[0]
    w0 = time.perf_counter()
    checked = plan(cluster, replace(req, solve_top=1)).plans[0]
    with_solver = time.perf_counter() - w0
    return {"plan_with_solver_check_s": with_solver, "solver": checked.solver,
            "gpus": result.world_size, "nodes": len(cluster.nodes), "parse_s": parse_s,
            "plan_wall_s_median": statistics.median(walls), "plan_cpu_s_median":
            statistics.median(cpus), "plan_wall_s": walls, "considered": result.considered,
            "feasible": result.feasible, "rejected_counts": result.rejected_counts,
            "top": top.as_dict(), "target_s": 2.0,
            "load_avg": os.getloadavg()}


def core_tflops() -> float:
    import torch
    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 10 * 2 * 512 ** 3 / best / 1e12


def calibrate(tmp: Path) -> dict[str, Any]:
    from workers.host.calibrate import run
    raw = run(nproc=2, out=tmp / "rows.json", max_bytes=1 << 20, iters=5)
    rows = [Row(r["primitive"], r["n"], r["bytes"], r["seconds"], "pcie") for r in raw]
    return {k: v.as_dict() for k, v in fit_by_class(rows).items()}


def _candidate(spec: Any) -> Candidate:
    p, t = spec.parallelism, spec.training
    m = p.pp_microbatches if p.pp > 1 else t.grad_accum_steps
    return Candidate(tp=p.tp, pp=p.pp, dp_shard=p.dp_shard, dp_replicate=p.dp_replicate,
                     zero_stage=p.effective_zero_stage(), microbatches=m,
                     activation_checkpointing=p.activation_checkpointing,
                     virtual_stages=p.pp_virtual_stages)


def predict(spec: Any, *, tflops: float, links: dict[str, Any]) -> float:
    world = spec.world_size
    cores = os.cpu_count() or 1
    hw = Hardware(memory_gb=1e6, peak_tflops=tflops * min(1.0, cores / world), efficiency=1.0,
                  precision="fp32")
    cluster = ClusterTopology(levels=(), nodes=(
        ClusterNode(name="cpu", topology=NodeTopology.uniform(world, "PIX")),))
    req = PlanRequest(model=ModelShape.from_gpt(spec.model), global_batch=spec.global_batch_size,
                      hardware=hw, schedule="gpipe" if spec.parallelism.pp_schedule == "gpipe"
                      else "1f1b")
    layout = layout_for(cluster, gpus=world, figures=figures_from({"links": links}))
    out = evaluate(_candidate(spec), req=req, layout=layout)
    if isinstance(out, Rejection):
        raise RuntimeError(f"{spec.name}: {out.message}")
    return out.step_s


def measure(spec_path: Path, *, world: int, steps: int, tmp: Path) -> float:
    out = tmp / spec_path.stem
    cmd = [PY, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--master_port",
           str(29600 + hash(spec_path.stem) % 300), "-m", "workers.loop.launch", "--spec",
           str(spec_path), "--out", str(out), "--steps", str(steps)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    times = [json.loads(line)["step_time_s"] for line in (out / "metrics.jsonl").read_text()
             .splitlines() if line.strip()]
    return statistics.median(times[2:] if len(times) > 3 else times)


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else 0.0


def tiny_ordering(steps: int) -> dict[str, Any]:
    from workers.loop.launch import load_spec
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        links = calibrate(tmp)
        tflops = core_tflops()
        rows = []
        for path in sorted((ROOT / "examples" / "tiny").glob("*.yaml")):
            spec = load_spec(path)
            pred = predict(spec, tflops=tflops, links=links)
            meas = measure(path, world=spec.world_size, steps=steps, tmp=tmp)
            rows.append({"spec": path.stem, "world": spec.world_size,
                         "predicted_step_s": pred, "measured_step_s": meas})
            print(f"  {path.stem:<16} world {spec.world_size}  predicted {pred * 1e3:8.2f} ms"
                  f"  measured {meas * 1e3:8.2f} ms", flush=True)
    rho = spearman([r["predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows])
    return {"core_tflops": tflops, "links": links, "steps": steps, "rows": rows,
            "spearman": rho, "load_avg": os.getloadavg()}


MEASURE = (ROOT / "tests" / "integration" / "planner" / "test_calibrate_memory.py")


def gpt2_memory() -> dict[str, Any]:
    sys.path.insert(0, str(MEASURE.parent))
    import test_calibrate_memory as t  # the test's spec and measuring script

    from orchestrator.spec import parse_spec
    with tempfile.TemporaryDirectory() as d:
        spec_path = Path(d) / "gpt2.json"
        spec_path.write_text(json.dumps(t.GPT2))
        out = subprocess.run([PY, "-c", t.MEASURE, str(spec_path), str(Path(d) / "run")],
                             capture_output=True, text=True, cwd=ROOT, timeout=900, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    measured = (got["peak_kb"] - got["base_kb"]) * 1024
    spec = parse_spec(t.GPT2)
    est = memory_per_gpu(ModelShape.from_gpt(spec.model), MemoryConfig(
        micro_batch=spec.training.micro_batch_size, precision="fp32", foreach_optimizer=False))
    return {"spec": t.GPT2, "measured_bytes": measured, "estimate": est.as_dict(),
            "relative_error": (est.total - measured) / measured}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "planner.json"))
    a = ap.parse_args()
    res: dict[str, Any] = {"planning_405b": planning_time(a.repeats)}
    p = res["planning_405b"]
    print(f"405B on {p['gpus']} GPUs / {p['nodes']} nodes: plan {p['plan_wall_s_median']:.3f} s "
          f"wall ({p['plan_cpu_s_median']:.3f} s CPU), parse {p['parse_s']:.2f} s; top "
          f"{p['top']['label']}", flush=True)
    if not a.skip_runs:
        res["gpt2_memory"] = gpt2_memory()
        g = res["gpt2_memory"]
        print(f"GPT-2-size peak RSS {g['measured_bytes'] / 1e9:.2f} GB vs estimate "
              f"{g['estimate']['total_gb']:.2f} GB ({g['relative_error']:+.1%})", flush=True)
        res["tiny_ordering"] = tiny_ordering(a.steps)
        print(f"Spearman rho (predicted vs measured step time, {len(res['tiny_ordering']['rows'])}"
              f" tiny specs): {res['tiny_ordering']['spearman']:.2f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
