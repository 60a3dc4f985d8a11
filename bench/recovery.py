"""Time to recover: a hang on one node of a simulated cluster, from the fault to the first
step of the next attempt on healthy hardware.

Cluster: `ray.cluster_utils.Cluster` with a CPU head and two nodes n1, n2 (2 CPUs and 2 fake
GPUs each, labels and a declared topology), the runtime in this process on a SQLite store.
Job: a tiny GPT, 2 data-parallel ranks (placed together on one node), a checkpoint every 5
steps, `watchdog.action: restart`, and the fault `nic_hang` on rank 1 at step 12 of attempt 1
(the rank blocks before its loss all-reduce after logging an NCCL NET/IB completion error:
hardware evidence on one node).

Phases, each from the previous one:
  fault        the last step completed before the hang (the workers' metrics)
  diagnosis    the hang watchdog's report stored (stall threshold + evidence round)
  cordon       the node health ledger cordoned the culprit's node
  re-placement the next attempt placed (PLACING) on the other node
  first step   the next attempt's first step done (process start, checkpoint load, step)
Steps lost = steps the next attempt recomputed (since the last checkpoint).
`defaults`: the watchdog's adaptive thresholds (max(12 s, 5 x p95 step time)); `fast`:
stall_timeout_s 3. Target: fault -> first step under 60 s with the defaults, no attempt on the
cordoned node, the job SUCCEEDED with the loss continuing from the checkpoint.

The peer: without a watchdog the hung ranks sit in the all-reduce until the collective
timeout (gloo 30 min, NCCL 10 min by default) and a restart that does not exclude the node
(Ray Train's, torchrun's) can land on it again.

    .venv/bin/python bench/recovery.py [--config defaults|fast|both]
                                       [--out bench/results/recovery.json]
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
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FAULT_STEP = 12
STEPS = 30
NODES = {"n1": "l0", "n2": "l1"}
TINY = {"kind": "gpt", "n_layers": 2, "n_heads": 2, "d_model": 32, "vocab_size": 64,
        "seq_len": 16}
PHASES = ("diagnosis", "cordon", "re-placement", "first step")


def spec_for(config: str) -> dict[str, Any]:
    watchdog: dict[str, Any] = {"action": "restart"}
    if config == "fast":
        watchdog.update(stall_timeout_s=3)
    return {
        "name": f"bench-recovery-{config}", "parallelism": {"dp_replicate": 2},
        "resources": {"cpus_per_worker": 0.25},
        "model": dict(TINY),
        "training": {"steps": STEPS, "micro_batch_size": 2, "lr": 0.01},
        "checkpoint": {"enabled": True, "every_steps": 5, "async_save": False},
        "fault_tolerance": {"max_failures": 1, "init_timeout_s": 120,
                            "collective_timeout_s": 120},
        "watchdog": watchdog,
        "inject_fault": {"kind": "nic_hang", "rank": 1, "step": FAULT_STEP, "attempt": 1},
    }


def _cluster_file(path: Path) -> Path:
    import yaml

    doc = {"levels": ["leaf"], "nodes": [
        {"name": n, "gpus": 2, "intra_node": "nvswitch", "labels": {"leaf": leaf}}
        for n, leaf in NODES.items()]}
    path.write_text(yaml.safe_dump(doc))
    return path


def _terminal(store: Any, job_id: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job.state.terminal:
            return job
        time.sleep(0.25)
    return store.get_job(job_id)


def measure(store: Any, job_id: str) -> dict[str, Any]:
    from api.routes.job_data import job_goodput

    job = store.get_job(job_id)
    attempts = store.list_attempts(job_id)
    events = store.list_events(job_id, limit=10_000)
    metrics = store.list_metrics(job_id, rank=0, limit=100_000)
    first_m = [m for m in metrics if m.attempt == 1]
    next_m = [m for m in metrics if m.attempt == 2]
    diags = store.list_diagnoses(job_id)
    cordon = next((e for e in events if e.reason == "NODE_CORDONED"), None)
    placed = [e for e in events if e.kind == "state" and e.dst == "PLACING"]
    t = {"fault": max((m.time for m in first_m), default=None),
         "diagnosis": diags[0].created_at.timestamp() if diags else None,
         "cordon": cordon.at.timestamp() if cordon else None,
         "re-placement": placed[1].at.timestamp() if len(placed) > 1 else None,
         "first step": min((m.time for m in next_m), default=None)}
    phases = {}
    prev = t["fault"]
    for p in PHASES:
        phases[p] = round(t[p] - prev, 2) if t[p] is not None and prev is not None else None
        prev = t[p] if t[p] is not None else prev
    total = (t["first step"] - t["fault"]) if t["first step"] and t["fault"] else None
    bad = cordon.data.get("node") if cordon else None
    nodes = [sorted({b["node"] for b in (a.placement or {}).get("bundles", [])})
             for a in attempts]
    reached = max((m.step for m in first_m), default=0)
    lost = sorted(m.step for m in next_m if m.step <= reached)
    loss_at = {m.step: m.loss for m in first_m}
    same = [(s, loss_at[s], m.loss) for m in next_m for s in [m.step] if s in loss_at][:3]
    g = job_goodput(job, store)
    return {
        "job": job_id, "state": str(job.state), "attempts": [a.state for a in attempts],
        "nodes_per_attempt": nodes, "cordoned": bad,
        "placed_on_cordoned": sum(1 for ns in nodes[1:] if bad in ns),
        "verdict": diags[0].verdict if diags else None,
        "fault_to_first_step_s": round(total, 2) if total is not None else None,
        "phases_s": phases,
        "phase_share": {p: round(v / total, 3) for p, v in phases.items()
                        if v is not None and total}, "steps_lost": len(lost),
        "resumed_from_step": (min(m.step for m in next_m) - 1) if next_m else None,
        "loss_redo_vs_first": same,
        "last_step": max((m.step for m in next_m), default=None),
        "goodput": {k: round(v, 2) for k, v in g.seconds.items()},
        "goodput_ratio": round(g.ratio, 3), "wall_s": round(g.wall_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=["defaults", "fast", "both"], default="both")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "recovery.json"))
    args = ap.parse_args()
    configs = ["defaults", "fast"] if args.config == "both" else [args.config]

    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.runtime.service import Runtime
    from orchestrator.settings import Settings
    from orchestrator.spec import parse_spec
    from orchestrator.store import open_store

    rows = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="meshyard-recovery-") as tmp:
        cluster = Cluster(initialize_head=True,
                          head_node_args={"num_cpus": 1, "include_dashboard": False})
        try:
            for name, leaf in NODES.items():
                cluster.add_node(num_cpus=2, num_gpus=2,
                                 labels={"meshyard.io/node": name, "leaf": leaf})
            cluster.wait_for_nodes()
            for config in configs:
                data = Path(tmp) / config
                data.mkdir()
                store = open_store(f"sqlite:///{data / 'meshyard.db'}")
                settings = Settings(data_dir=data, ray_address=cluster.address,
                                    cluster_file=_cluster_file(data / "cluster.yaml"),
                                    allow_fault_injection=True)
                rt = Runtime(settings, store, tick_s=0.25)  # the serve default tick
                rt.start()
                try:
                    job, _ = store.submit_job(parse_spec(spec_for(config)), owner="admin")
                    _terminal(store, job.id, 420.0)
                    row = {"config": config, **measure(store, job.id)}
                finally:
                    rt.stop()
                    store.close()
                    ray.shutdown()
                rows.append(row)
                print(json.dumps(row, default=str), flush=True)
        finally:
            cluster.shutdown()
    out = {"rows": rows, "wall_s": round(time.time() - t0, 1), "loadavg": os.getloadavg(),
           "target_s": 60}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
