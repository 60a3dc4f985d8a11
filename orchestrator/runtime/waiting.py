"""Why a queued job waits, recorded: its pending reason (a job that can never fit fails as
INFEASIBLE once it has waited `placement.timeout_s`, unless it waits for capacity), and the
nodes its next attempt avoids (`policy.avoid_nodes` over its failed attempts).
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.lifecycle import JobEventKind, JobState, Reason
from orchestrator.placement.gang_plan import Pending, PendingKind
from orchestrator.runtime.policy import AttemptFailure, avoid_nodes, fail_infeasible
from orchestrator.spec import JobSpec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store

_START_MOVES_S = 30.0


def job_failures(store: Store, job: JobRecord) -> list[AttemptFailure]:
    return [AttemptFailure.from_event_data(e.data)
            for e in store.list_events(job.id) if e.kind == JobEventKind.ERROR]


def job_avoids(store: Store, job: JobRecord) -> set[str]:
    """Nodes the job's next attempt avoids (`policy.avoid_nodes` over its failures)."""
    if job.current_attempt < 1:
        return set()
    return avoid_nodes(current_attempt=job.current_attempt, failures=job_failures(store, job))


def record_reason(store: Store, job: JobRecord, reason: dict[str, Any]) -> None:
    """Records a reservation's pending reason (`Reservation.reason`): written when what it
    waits for changed, or its expected start moved by more than `_START_MOVES_S` (the
    estimate drifts every pass; rewriting it each pass would only churn the store)."""
    before = job.pending_reason or {}
    was, now = before.get("reservation") or {}, reason.get("reservation") or {}
    same = (before.get("kind") == reason.get("kind")
            and {k: v for k, v in was.items() if k != "expected_start"}
            == {k: v for k, v in now.items() if k != "expected_start"})
    a, b = was.get("expected_start"), now.get("expected_start")
    if same and (a is None) == (b is None) and (a is None or abs(a - b) <= _START_MOVES_S):
        return
    store.set_pending_reason(job.id, reason)


def record_pending(store: Store, job: JobRecord, spec: JobSpec, pending: Pending) -> None:
    """Records why the job waits; one that can never fit fails as INFEASIBLE after
    placement.timeout_s (`policy.fail_infeasible`)."""
    reason = pending.to_dict()
    if pending.kind == PendingKind.INFEASIBLE:
        before = job.pending_reason or {}
        since = before.get("infeasible_since") if before.get("kind") == reason["kind"] \
            else None
        reason["infeasible_since"] = since if isinstance(since, int | float) \
            else time.time()
        timeout = spec.placement.timeout_s
        if fail_infeasible(infeasible_since=reason["infeasible_since"], now=time.time(),
                           timeout_s=timeout,
                           wait_for_capacity=spec.placement.wait_for_capacity):
            store.transition(
                job.id, JobState.FAILED, reason=Reason.INFEASIBLE,
                message=f"{pending.message.rstrip('.')}. It can never fit this cluster as "
                f"it is and waited {timeout:g} s (placement.timeout_s); on a cluster that "
                "grows, set placement.wait_for_capacity: true", data=reason)
            return
    if job.pending_reason != reason:
        store.set_pending_reason(job.id, reason)
