"""Job lifecycle: states, the transition table, typed reasons, and the one `transition()`.

Pure module. `transition()` is the only function that changes a job's state; it returns the new
state and the event to record, and raises IllegalTransition for anything not in the table.
The store applies the pair atomically (state column + event row in one transaction).

A job has attempts (`AttemptState`, one row per attempt) and an attempt has ranks
(`RankState`, what the attempt's controller last reported for each).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    QUEUED = "QUEUED"
    PLACING = "PLACING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    CANCELLING = "CANCELLING"
    # stopped for a higher-priority job: its ranks checkpoint and stop, then it is QUEUED
    # again and resumes from that checkpoint (its restart budget untouched)
    PREEMPTED = "PREEMPTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.PLACING, JobState.STARTING, JobState.RUNNING,
                           JobState.RESTARTING, JobState.CANCELLING, JobState.PREEMPTED})


class Reason(StrEnum):
    """Why a transition happened. Failure reasons come first."""

    NO_RESOURCES = "NO_RESOURCES"
    INFEASIBLE = "INFEASIBLE"
    PLACEMENT_TIMEOUT = "PLACEMENT_TIMEOUT"
    SETUP_ERROR = "SETUP_ERROR"
    WORKER_CRASH = "WORKER_CRASH"
    USER_ERROR = "USER_ERROR"  # the job's own code raised or exited non-zero: not retried
    HANG_DETECTED = "HANG_DETECTED"
    MAX_FAILURES = "MAX_FAILURES"
    CONTROLLER_LOST = "CONTROLLER_LOST"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    PREFLIGHT_FAILED = "PREFLIGHT_FAILED"  # a link of the placement failed the check
    # the checkpoint store did not answer while a restarted attempt's hosts waited for it
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    # non-failure reasons
    SUBMITTED = "SUBMITTED"
    PLACEMENT_FOUND = "PLACEMENT_FOUND"
    WORKERS_READY = "WORKERS_READY"
    FIRST_STEP = "FIRST_STEP"
    PROCESSES_STARTED = "PROCESSES_STARTED"  # user code: every rank's process runs
    COMPLETED = "COMPLETED"
    RESTART_SCHEDULED = "RESTART_SCHEDULED"
    USER_CANCELLED = "USER_CANCELLED"
    WORKERS_STOPPED = "WORKERS_STOPPED"
    REQUEUED = "REQUEUED"
    PROGRESS_RESUMED = "PROGRESS_RESUMED"
    NODE_CORDONED = "NODE_CORDONED"  # the node health ledger took a node of the job out
    NODE_SUSPECT = "NODE_SUSPECT"
    PLANNED = "PLANNED"  # `parallelism: auto` resolved to a plan at submit (data: the plan)
    SPEC_WARNING = "SPEC_WARNING"  # accepted, but known to train badly (spec.spec_warnings)
    METRICS_DROPPED = "METRICS_DROPPED"  # reported metric names refused (metric_values.py)
    PREEMPTED = "PREEMPTED"  # stopped for a higher-priority job (data: preempted_by), requeued
    LINK_GAP = "LINK_GAP"  # a rank's host answered nothing for seconds, then again (data: node)
    SLOW_LINK = "SLOW_LINK"  # the gang slowed together and one host's link is the slow end
    METRICS_UNRECOVERED = "METRICS_UNRECOVERED"  # a lost rank's file was on an unreachable host


FAILURE_REASONS = frozenset({Reason.NO_RESOURCES, Reason.INFEASIBLE, Reason.PLACEMENT_TIMEOUT,
                             Reason.SETUP_ERROR, Reason.USER_ERROR, Reason.WORKER_CRASH,
                             Reason.HANG_DETECTED, Reason.MAX_FAILURES, Reason.CONTROLLER_LOST,
                             Reason.INTERNAL_ERROR, Reason.PREFLIGHT_FAILED,
                             Reason.STORE_UNAVAILABLE})

class JobEventKind(StrEnum):
    """A job event's kind: a state transition (written only with it), or a note."""

    STATE = "state"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogStream(StrEnum):
    """Where a job's log line came from: a rank's stdout / stderr, or meshyard's own log of
    that rank (setup, checkpoints, faults)."""

    STDOUT = "stdout"
    STDERR = "stderr"
    LOG = "log"


class AttemptState(StrEnum):
    """An attempt's row in the store. RUNNING from the moment it is placed until it ends."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PLACEMENT_TIMEOUT = "PLACEMENT_TIMEOUT"
    LOST = "LOST"  # its controller vanished before training started
    PREEMPTED = "PREEMPTED"  # stopped for a higher-priority job (not a failure)


class RankState(StrEnum):
    """A rank as its controller reports it: STARTING until its worker runs, then the worker's
    own state (IDLE ... ERROR), and the attempt's end (SUCCEEDED, FAILED, CANCELLED). When a
    rank's failure ends the attempt, the ranks that failed only because a peer went away are
    PEER_LOST and the ranks meshyard stopped are STOPPED."""

    STARTING = "STARTING"
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PEER_LOST = "PEER_LOST"


S = JobState
# from-state -> allowed to-states. Anything else is a bug in the caller.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.PLACING, S.CANCELLED, S.FAILED}),
    # PLACING -> QUEUED: the gang reservation timed out; the job waits again.
    S.PLACING: frozenset({S.STARTING, S.QUEUED, S.CANCELLING, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.RESTARTING, S.CANCELLING, S.FAILED, S.SUCCEEDED,
                           S.PREEMPTED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.RESTARTING, S.CANCELLING, S.FAILED, S.PREEMPTED}),
    # PREEMPTED -> QUEUED: its workers stopped (after a checkpoint); it waits to resume.
    # It may also finish, fail (restart policy as ever) or be cancelled while stopping.
    S.PREEMPTED: frozenset({S.QUEUED, S.SUCCEEDED, S.RESTARTING, S.CANCELLING, S.FAILED}),
    # RESTARTING -> QUEUED: the next attempt needs a fresh placement.
    S.RESTARTING: frozenset({S.QUEUED, S.PLACING, S.STARTING, S.CANCELLING, S.FAILED}),
    S.CANCELLING: frozenset({S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, src: JobState, dst: JobState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[src])) or "none (terminal state)"
        super().__init__(f"illegal job transition {src} -> {dst}; allowed from {src}: {allowed}")
        self.src, self.dst = src, dst


@dataclass(frozen=True)
class TransitionEvent:
    """The event a transition records: kind 'state', with from/to, reason and message."""

    src: JobState
    dst: JobState
    reason: Reason
    message: str
    at: datetime
    data: dict[str, Any] = field(default_factory=dict)


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]


def transition(src: JobState, dst: JobState, *, reason: Reason, message: str = "",
               data: dict[str, Any] | None = None, now: datetime | None = None) -> TransitionEvent:
    """Validates src -> dst and returns the event to record with it.

    >>> transition(JobState.QUEUED, JobState.PLACING, reason=Reason.PLACEMENT_FOUND).dst
    <JobState.PLACING: 'PLACING'>
    """
    src, dst = JobState(src), JobState(dst)
    if not can_transition(src, dst):
        raise IllegalTransition(src, dst)
    if dst == JobState.FAILED and reason not in FAILURE_REASONS:
        raise ValueError(f"a transition to FAILED needs a failure reason, got {reason}")
    return TransitionEvent(src=src, dst=dst, reason=Reason(reason), message=message,
                           at=now or datetime.now(UTC), data=dict(data or {}))
