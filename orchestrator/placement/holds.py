"""Which GPUs the active jobs hold: the one answer the scheduler, POST /v1/plans and the
dashboard share. Pure module (it reads the books through the `JobBooks` protocol, which
`orchestrator.store.Store` satisfies).

A job holds the GPUs of its current attempt: where its ranks really are once every rank has
reported its (node, GPU), and before that (PLACING, STARTING) where the attempt is planned,
so a job being placed is never counted as free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.placement.gang_plan import Bundle


@dataclass(frozen=True)
class GpuHold:
    job_id: str
    node: str | None  # node name
    node_id: str | None  # Ray node id
    gpu: int
    rank: int | None


class JobBooks(Protocol):
    """The reads `gpu_holds` needs (orchestrator.store.Store provides them)."""

    def active_jobs(self) -> Sequence[Any]: ...

    def list_ranks(self, job_id: str, *, attempt: int | None = None) -> Sequence[Any]: ...

    def list_attempts(self, job_id: str) -> Sequence[Any]: ...


def planned_holds(job_id: str, placement: Mapping[str, Any] | None) -> tuple[GpuHold, ...]:
    """The GPUs an attempt's stored placement (`GangPlan.to_dict()`) reserves."""
    bundles = [Bundle.from_dict(b) for b in (placement or {}).get("bundles", ())]
    return tuple(GpuHold(job_id=job_id, node=b.node, node_id=b.node_id, gpu=b.gpu, rank=b.rank)
                 for b in bundles if b.gpu is not None and b.node_id)


def job_holds(books: JobBooks, job: Any) -> tuple[GpuHold, ...]:
    """The GPUs one active job holds now (see the module doc)."""
    if job.current_attempt == 0:
        return ()
    ranks = books.list_ranks(job.id, attempt=job.current_attempt)
    if ranks and all((r.node_id or r.node) and r.gpu is not None for r in ranks):
        return tuple(GpuHold(job_id=job.id, node=r.node, node_id=r.node_id, gpu=int(r.gpu),
                             rank=r.rank) for r in ranks)
    attempt = next((a for a in books.list_attempts(job.id) if a.number == job.current_attempt),
                   None)
    return planned_holds(job.id, attempt.placement if attempt is not None else None)


def gpu_holds(books: JobBooks) -> list[tuple[Any, tuple[GpuHold, ...]]]:
    """Every active job with the GPUs it holds."""
    return [(job, job_holds(books, job)) for job in books.active_jobs()]


def busy_gpus(holds: Iterable[GpuHold]) -> dict[str, list[int]]:
    """GPU indices held, keyed by Ray node id and by node name (either finds the node)."""
    out: dict[str, list[int]] = {}
    for h in holds:
        for key in {h.node_id, h.node} - {None}:
            out.setdefault(str(key), []).append(h.gpu)
    return out
