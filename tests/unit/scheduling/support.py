"""Small clusters, jobs and the real gang planner for the scheduling-policy tests."""

from __future__ import annotations

from functools import cache

from orchestrator.placement.gang_plan import GangPlan, Pending, plan_job
from orchestrator.placement.snapshot import ClusterSnapshot
from orchestrator.scheduling.jobs import QueuedJob, RunningJob
from orchestrator.spec import JobSpec, parse_spec
from orchestrator.topology.declared import parse_cluster_doc

NOW = 1_700_000_000.0


def cluster(nodes: dict[str, str], *, gpus: int = 4,
            running: tuple[RunningJob, ...] = ()) -> ClusterSnapshot:
    """`nodes`: node name -> leaf; NVSwitch nodes of `gpus` GPUs, the running jobs' GPUs busy."""
    busy: dict[str, set[int]] = {}
    for r in running:
        for n, g in r.gpus_by_node.items():
            busy.setdefault(n, set()).update(g)
    topo = parse_cluster_doc({"levels": ["leaf"], "nodes": [
        {"name": n, "gpus": gpus, "intra_node": "nvswitch", "labels": {"leaf": leaf},
         "busy_gpus": sorted(busy.get(n, ()))} for n, leaf in nodes.items()]})
    return ClusterSnapshot(cluster=topo, ray_nodes=())


TWO_LEAVES = {"n1": "l0", "n2": "l0", "n3": "l1", "n4": "l1"}


@cache
def spec(tp: int, dp: int) -> JobSpec:
    return parse_spec({"name": "t", "parallelism": {"tp": tp, "dp_replicate": dp},
                       "resources": {"device": "cuda"},
                       "model": {"n_heads": 32, "d_model": 4096}})


def queued(job_id: str, *, tp: int = 1, dp: int = 1, priority: int = 0, est: float | None = None,
           waited: float = 0.0, seq: int = 0) -> QueuedJob:
    return QueuedJob(id=job_id, priority=priority, submitted_at=NOW - waited, gpus=tp * dp,
                     est_runtime_s=est, seq=seq, shape=(tp, dp))


def running(job_id: str, gpus: dict[str, tuple[int, ...]], *, priority: int = 0,
            ends_in: float | None = None, ran: float = 3600.0, since_ckpt: float | None = None,
            preemptible: bool = True) -> RunningJob:
    return RunningJob(id=job_id, priority=priority, gpus_by_node=gpus, started_at=NOW - ran,
                      est_end=None if ends_in is None else NOW + ends_in,
                      last_checkpoint_at=None if since_ckpt is None else NOW - since_ckpt,
                      preemptible=preemptible)


def planner(job: QueuedJob, snap: ClusterSnapshot) -> GangPlan | Pending:
    tp, dp = job.shape  # type: ignore[misc]
    return plan_job(spec(tp, dp), snap)
