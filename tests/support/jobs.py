"""Submitting a job straight to a store and waiting for it: the helpers every package that
runs jobs through a Runtime uses (tests/integration/runtime, tests/integration/watchdog)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from orchestrator.lifecycle import JobState
from orchestrator.spec import parse_spec
from orchestrator.store.repo import Store

TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def submit(store: Store, spec: dict[str, Any], *, owner: str = "admin") -> str:
    """Validates `spec` as the API would and queues it; returns the job id."""
    job, _ = store.submit_job(parse_spec(spec), owner=owner)
    return job.id


def wait_for(store: Store, job_id: str, pred: Callable[[Any], bool], *,
             timeout_s: float = 180.0, what: str = "", poll_s: float = 0.2) -> Any:
    """The job once `pred(job)` holds; fails after `timeout_s` (a generous bound, not a
    measured time) with the job's state, pending reason and events."""
    deadline = time.monotonic() + timeout_s
    job = store.get_job(job_id)
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job is not None and pred(job):
            return job
        time.sleep(poll_s)
    events = [(e.kind, e.src, e.dst, e.reason, e.message[:300]) for e in store.list_events(job_id)]
    raise AssertionError(f"{job_id} never reached {what}: state {job.state if job else None}, "
                         f"pending {job.pending_reason if job else None}, "
                         f"events {events}")


def until(pred: Callable[[], Any], *, timeout_s: float, what: str, poll_s: float = 0.2) -> Any:
    """`pred()`'s first truthy value; fails after `timeout_s` (a generous bound) naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def wait_state(store: Store, job_id: str, *states: JobState, timeout_s: float = 180.0) -> Any:
    return wait_for(store, job_id, lambda j: j.state in states, timeout_s=timeout_s,
                    what="/".join(states))


def apply_controller_event(store: Store, job_id: str, payload: Any, *, attempt: int = 1) -> None:
    """`payload` stored as the attempt's controller would send it (the poller's path), with
    the default node-health policy."""
    from orchestrator.nodes.health_policy import HealthPolicy
    from orchestrator.runtime.attempt_events import AttemptEvents
    from orchestrator.runtime.events import ControllerEvent

    events = AttemptEvents(store, health_policy=HealthPolicy(), runs_dir=None,
                           write_ranks=lambda *a: None)
    events.apply(job_id, attempt, ControllerEvent(seq=1, payload=payload))
