"""The scheduling policy's view of the store's jobs: `RunningJob`s from the active jobs and
their held GPUs, `QueuedJob`s for the queue, with their time estimates.

Estimates (orchestrator/scheduling/: a reservation's start, who may backfill):
  running job   est_end = its last reported step's time + remaining steps x measured step time
                (rank 0's rows of the current attempt: the wall time between its first and
                last recent rows over the steps between them, so checkpoints and syncs count)
  queued job    est_runtime_s = remaining steps x the step time an earlier attempt measured
A job that reports no steps (user code without `steps`), or has not run two steps yet, has no
estimate: nothing backfills before a reservation that waits for it, and it backfills nothing.

Reads are cached by (job, attempt, last step), so a tick with nothing new costs no query.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.lifecycle import JobState
from orchestrator.placement.holds import GpuHold
from orchestrator.scheduling.jobs import QueuedJob, RunningJob
from orchestrator.spec import JobSpec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store

_RECENT_STEPS = 32  # rows of rank 0 a step time is measured over
_CANCEL_S = 8.0  # a cancelled job's workers are stopped by then (poller: by force)


def step_time(rows: Sequence[Any]) -> tuple[float, float, int] | None:
    """(seconds per step, time of the newest row, its step) from metric rows of one attempt
    and rank, or None with fewer than two distinct steps and no reported step time.

    >>> from types import SimpleNamespace as R
    >>> step_time([R(step=2, time=10.0, step_time_s=1.0), R(step=6, time=18.0, step_time_s=1.0)])
    (2.0, 18.0, 6)
    """
    rows = sorted(rows, key=lambda r: r.step)
    if not rows:
        return None
    last = rows[-1]
    first = rows[0]
    if last.step > first.step and last.time > first.time:
        return (last.time - first.time) / (last.step - first.step), last.time, last.step
    reported = [r.step_time_s for r in rows if r.step_time_s]
    if reported:
        return sum(reported) / len(reported), last.time, last.step
    return None


class JobEstimates:
    """Step times of the store's jobs, cached per (job, attempt, last step)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[str, tuple[tuple[Any, ...], tuple[float, float, int] | None]] = {}
        self._checkpoints: dict[str, tuple[tuple[Any, ...], float | None]] = {}
        self._started: dict[tuple[str, int], float] = {}

    def _measured(self, job: JobRecord, *, current_only: bool) -> tuple[float, float, int] | None:
        key = (job.current_attempt, job.last_step, current_only)
        hit = self._cache.get(job.id)
        if hit is not None and hit[0] == key:
            return hit[1]
        got = None
        if job.last_step:
            rows = self.store.list_metrics(job.id, rank=0,
                                           after_step=max(0, job.last_step - _RECENT_STEPS))
            if current_only:
                rows = [r for r in rows if r.attempt == job.current_attempt]
            else:  # the newest attempt that reported rows
                newest = max((r.attempt for r in rows), default=None)
                rows = [r for r in rows if r.attempt == newest]
            got = step_time(rows)
        self._cache[job.id] = (key, got)
        return got

    def est_end(self, job: JobRecord) -> float | None:
        """When the running job should end (epoch seconds), or None without an estimate."""
        if not job.total_steps:
            return None
        got = self._measured(job, current_only=True)
        if got is None:
            return None
        per_step, at, step = got
        return at + max(0, job.total_steps - step) * per_step

    def est_runtime_s(self, job: JobRecord) -> float | None:
        """How long the queued job should run once placed, from an earlier attempt's steps."""
        if not job.total_steps or not job.last_step:
            return None
        got = self._measured(job, current_only=False)
        if got is None:
            return None
        return max(0, job.total_steps - job.last_step) * got[0]

    def started_at(self, job: JobRecord) -> float:
        """When the job's current attempt was created (placed)."""
        key = (job.id, job.current_attempt)
        if key not in self._started:
            attempt = next((a for a in self.store.list_attempts(job.id)
                            if a.number == job.current_attempt), None)
            self._started[key] = (attempt.created_at if attempt is not None
                                  else job.updated_at).timestamp()
        return self._started[key]

    def last_checkpoint_at(self, job: JobRecord) -> float | None:
        """When the job's newest checkpoint was saved (any attempt: a resume starts there)."""
        key = (job.current_attempt, job.last_step)
        hit = self._checkpoints.get(job.id)
        if hit is not None and hit[0] == key:
            return hit[1]
        saved = [c for c in self.store.list_checkpoints(job.id) if not c.removed]
        at = max((c.at.timestamp() for c in saved), default=None)
        self._checkpoints[job.id] = (key, at)
        return at

    def forget(self, keep: set[str]) -> None:
        for cache in (self._cache, self._checkpoints):
            for job_id in [j for j in cache if j not in keep]:
                del cache[job_id]
        self._started = {k: v for k, v in self._started.items() if k[0] in keep}


def running_jobs(held: Sequence[tuple[JobRecord, Sequence[GpuHold]]], *,
                 estimates: JobEstimates, specs: Mapping[str, JobSpec]) -> list[RunningJob]:
    """The active jobs that hold GPUs, as the scheduling policy sees them. Only STARTING
    and RUNNING jobs whose spec allows it may be preempted; a job already stopping ends when
    its stop does (a preempted one within its grace period)."""
    out = []
    for job, holds in held:
        gpus: dict[str, list[int]] = {}
        for h in holds:
            if h.node is not None:
                gpus.setdefault(h.node, []).append(h.gpu)
        if not gpus:
            continue
        spec = specs.get(job.id)
        grace = spec.preemption.grace_s if spec is not None else 60.0
        end = estimates.est_end(job)
        if job.state == JobState.PREEMPTED:
            end = job.updated_at.timestamp() + grace
        elif job.state == JobState.CANCELLING:
            end = job.updated_at.timestamp() + _CANCEL_S
        out.append(RunningJob(
            id=job.id, priority=job.priority, gpus_by_node={n: tuple(g) for n, g in gpus.items()},
            started_at=estimates.started_at(job), est_end=end,
            last_checkpoint_at=estimates.last_checkpoint_at(job),
            preemptible=(spec is not None and spec.preemption.preemptible
                         and job.state in (JobState.STARTING, JobState.RUNNING))))
    return out


def queued_job(job: JobRecord, *, gpus: int, estimates: JobEstimates) -> QueuedJob:
    return QueuedJob(id=job.id, priority=job.priority, submitted_at=job.created_at.timestamp(),
                     gpus=gpus, est_runtime_s=estimates.est_runtime_s(job), owner=job.owner,
                     seq=job.seq)
