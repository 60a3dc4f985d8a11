"""Seeds a real store with what the control plane would write: cluster nodes from a declared
cluster file, jobs in every state, attempts, ranks on (node, GPU) with mesh coordinates,
metric series, logs and a hang diagnosis built with the watchdog's own report classes.

Used by the dashboard's unit tests (TestClient) and by the browser tests (which write into
the same SQLite file a `meshyard serve` subprocess reads).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.lifecycle import JobState, Reason
from orchestrator.mesh import MeshShape
from orchestrator.spec import parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.topology.declared import load_cluster_file
from orchestrator.topology.serialize import node_topology_to_dict
from orchestrator.watchdog.report import (
    DiagnosisReport,
    Mismatch,
    PgProgress,
    RankLocation,
    RankReport,
    SuspectHardware,
    Verdict,
)

REPO = Path(__file__).resolve().parents[3]
CLUSTER_FILE = REPO / "examples" / "clusters" / "dgx_h100_two_leaves.yaml"
XSS_NAME = "<img src=x onerror=alert(1)>"
S = JobState


def seed_cluster(store: Store, path: Path = CLUSTER_FILE) -> list[str]:
    cluster = load_cluster_file(path)
    for n in cluster.nodes:
        store.upsert_node(name=n.name, node_id=n.node_id, alive=True, labels=dict(n.labels),
                          gpus=len(n.topology.gpus), cpus=64.0,
                          topology=node_topology_to_dict(n.topology))
    return [n.name for n in cluster.nodes]


def spec_doc(name: str, *, tp: int = 1, pp: int = 1, dp_shard: int = 1, dp_replicate: int = 1,
             ep: int = 1, steps: int = 100) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name, "version": 1,
        "parallelism": {"tp": tp, "pp": pp, "dp_shard": dp_shard, "dp_replicate": dp_replicate,
                        "pp_microbatches": pp},
        "model": {"kind": "gpt", "n_layers": max(2, pp * 2), "n_heads": 8, "d_model": 64,
                  "vocab_size": 256, "seq_len": 64},
        "training": {"steps": steps, "micro_batch_size": 8}}
    if ep > 1:  # expert parallel: a MoE model, no checkpoints
        doc["parallelism"]["ep"] = ep
        doc["model"]["moe"] = {"experts": ep * 2}
        doc["checkpoint"] = {"enabled": False}
    return doc


def submit(store: Store, doc: dict[str, Any], *, owner: str = "admin") -> JobRecord:
    job, _ = store.submit_job(parse_spec(doc), owner=owner)
    return job


def walk(store: Store, job_id: str, *states: JobState) -> JobRecord:
    """Moves a job through `states` with the reasons the runtime would use."""
    reasons = {S.PLACING: Reason.PLACEMENT_FOUND, S.STARTING: Reason.WORKERS_READY,
               S.RUNNING: Reason.FIRST_STEP, S.SUCCEEDED: Reason.COMPLETED,
               S.FAILED: Reason.HANG_DETECTED, S.CANCELLING: Reason.USER_CANCELLED,
               S.CANCELLED: Reason.WORKERS_STOPPED, S.RESTARTING: Reason.WORKER_CRASH,
               S.QUEUED: Reason.REQUEUED}
    job = store.get_job(job_id)
    assert job is not None
    for dst in states:
        job = store.transition(job_id, dst, reason=reasons[dst], message=f"to {dst.value}")
    return job


def place(store: Store, job: JobRecord, nodes: list[str], *, gpus_per_node: int = 8,
          state: str = "running", step: int | None = None) -> int:
    """Starts an attempt and writes ranks packed onto `nodes` in rank order."""
    mesh = MeshShape.from_parallelism(job.spec.parallelism)
    attempt = store.start_attempt(job.id, placement={"nodes": nodes}).number
    now = datetime.now(UTC)
    ranks = [{"rank": r, "node": nodes[r // gpus_per_node], "node_id": None,
              "gpu": r % gpus_per_node, "coords": mesh.coords(r), "state": state,
              "step": step, "phase": "forward", "last_heartbeat": now, "pid": 1000 + r}
             for r in range(mesh.world_size)]
    store.upsert_ranks(job.id, attempt, ranks)
    return attempt


def add_training(store: Store, job: JobRecord, attempt: int, *, steps: int,
                 ranks: int = 2, extra: dict[str, float] | None = None) -> None:
    """`steps` steps of metrics per rank; `extra`: more metrics, the same every step."""
    t0 = time.time() - steps
    rows = [{"rank": r, "step": s, "time": t0 + s, "loss": 5.0 * 0.97 ** s + 0.01 * r,
             "grad_norm": 1.0 / s, "step_time_s": 0.5, "tokens_per_s": 1000.0 + 10 * s,
             "lr": 3e-3, **(extra or {})}
            for s in range(1, steps + 1) for r in range(ranks)]
    store.add_metrics(job.id, attempt, rows)
    store.add_logs(job.id, attempt, [{"rank": r, "stream": "stdout",
                                      "line": f"rank {r} step {s} loss {5.0 * 0.97 ** s:.3f}"}
                                     for s in range(1, min(steps, 20) + 1) for r in range(ranks)])


def hang_report(*, world: int, culprit: int, mesh: MeshShape, nodes: list[str],
                artifacts: list[str] | None = None) -> DiagnosisReport:
    """A COLLECTIVE_MISMATCH-style report: `culprit` never enqueued all_reduce #7."""
    evidence = []
    for r in range(world):
        late = r == culprit
        loc = RankLocation(node=nodes[r // 8], gpu=r % 8, labels={"leaf": "leaf-a"},
                           mesh={k: v for k, v in mesh.coords(r).items()})
        evidence.append(RankReport(
            rank=r, state="not_joined" if late else "waiting", step=12,
            pgs=(PgProgress(pg="dp", last_enqueued=6 if late else 7, last_completed=6,
                            pending_op=None if late else "all_reduce #7"),),
            top_of_stack="data.py:88 in next_batch" if late else "distributed_c10d.py:2501 in "
                                                                "all_reduce",
            nccl_errors=(), location=loc, has_trace=True))
    return DiagnosisReport(
        verdict=Verdict.NOT_JOINED, culprit_ranks=(culprit,), confidence=0.9,
        summary=f"Rank {culprit} ({nodes[culprit // 8]} GPU {culprit % 8}) never joined "
                "all_reduce #7 on pg dp; every other rank waits for it.",
        evidence=tuple(evidence),
        mismatches=(Mismatch(pg="dp", seq=7, field="op", expected="all_reduce",
                             actual={culprit: "<not enqueued>"}),),
        suspect_hardware=(SuspectHardware(level="gpu", name=f"{nodes[culprit // 8]}:"
                                          f"{culprit % 8}", ranks=(culprit,),
                                          reason="the only rank behind"),),
        recommendations=(f"Inspect rank {culprit}'s data loader: its stack is in next_batch.",
                         "Re-run with a shorter hang threshold to capture earlier."),
        artifacts=tuple(artifacts or ()),
        details={"stacks": {str(culprit): "Traceback (most recent call last):\n  "
                                          "File \"loop.py\", line 40, in step\n  "
                                          "File \"data.py\", line 88, in next_batch"}})


def seed_everything(store: Store, *, owner: str = "admin") -> dict[str, JobRecord]:
    """One job per state worth showing, on the two-leaf DGX cluster."""
    nodes = seed_cluster(store)
    out: dict[str, JobRecord] = {}
    out["queued"] = submit(store, spec_doc("waits-for-gpus", dp_replicate=4), owner=owner)
    store.set_pending_reason(out["queued"].id, {"reason": "NO_RESOURCES",
                                                "message": "needs 4 GPUs; 0 free"})
    run = submit(store, spec_doc("tp4-pp2-dp2", tp=4, pp=2, dp_replicate=2, steps=200),
                 owner=owner)
    walk(store, run.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(store, run, nodes[:2], step=30)
    add_training(store, run, attempt, steps=30, ranks=16)
    out["running"] = store.get_job(run.id) or run
    done = submit(store, spec_doc("finished-ddp", dp_replicate=2, steps=20), owner=owner)
    walk(store, done.id, S.PLACING, S.STARTING, S.RUNNING, S.SUCCEEDED)
    out["succeeded"] = done
    hung = submit(store, spec_doc("hung-dp", dp_replicate=8, steps=100), owner=owner)
    walk(store, hung.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(store, hung, nodes[2:3], step=12)
    report = hang_report(world=8, culprit=5, mesh=MeshShape(dp_replicate=8), nodes=nodes[2:3])
    store.add_diagnosis(hung.id, attempt, verdict=report.verdict.value,
                        culprit_ranks=list(report.culprit_ranks), summary=report.summary,
                        report=report.to_dict())
    walk(store, hung.id, S.FAILED)
    out["failed"] = store.get_job(hung.id) or hung
    out["xss"] = submit(store, spec_doc(XSS_NAME), owner=owner)
    return out


def open_condition(store: Store, job: JobRecord, attempt: int, report: DiagnosisReport, *,
                   since: float | None = None) -> int:
    """Stores `report` as the attempt's diagnosis and opens the job's condition from it, the
    way the poller does; returns the diagnosis id."""
    from orchestrator.watchdog.condition import JobCondition

    d = store.add_diagnosis(job.id, attempt, verdict=report.verdict.value,
                            culprit_ranks=list(report.culprit_ranks), summary=report.summary,
                            report=report.to_dict())
    current = store.get_job(job.id)
    condition = JobCondition.from_report(report, diagnosis_id=d.id, attempt=attempt,
                                         since=since or time.time(),
                                         step=current.last_step if current else None)
    store.set_condition(job.id, condition.to_dict())
    return d.id


def add_usage(store: Store, job: JobRecord, attempt: int, *, ranks: int, nodes: list[str],
              samples: int = 20, gpus_per_node: int = 8, gpu: bool = True) -> None:
    """Utilisation rows like the controller writes (every 10 s), with NVML GPU fields."""
    t0 = time.time() - samples * 10
    rows = [{"rank": r, "node": nodes[r // gpus_per_node], "at": t0 + 10 * i,
             "cpu_percent": 80.0 + r + (i % 5), "rss_bytes": (1 + r) * 2**30 + i * 2**20,
             "gpu_util": (50.0 + r) if gpu else None,
             "gpu_mem_bytes": (10 + r) * 2**30 if gpu else None,
             "gpu_mem_total_bytes": 80 * 2**30 if gpu else None}
            for i in range(samples) for r in range(ranks)]
    store.add_rank_usage(job.id, attempt, rows)


def add_node_usage(store: Store, nodes: list[str], *, samples: int = 10,
                   gpus: int = 8) -> None:
    t0 = time.time() - samples * 30
    store.add_node_usage([{"node": n, "at": t0 + 30 * i, "cpu_percent": 20.0 + 5 * (i % 4),
                           "mem_used_bytes": 300 * 2**30, "mem_total_bytes": 2048 * 2**30,
                           "gpus": [{"index": g, "util": 40.0 + g, "mem_used_bytes": 20 * 2**30,
                                     "mem_total_bytes": 80 * 2**30} for g in range(gpus)]}
                          for i in range(samples) for n in nodes])
