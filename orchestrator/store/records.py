"""Frozen records the store returns. Rows never leave orchestrator/store."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from orchestrator.admission.access import Role
from orchestrator.jobs.status_line import status_line
from orchestrator.lifecycle import JobState
from orchestrator.spec import JobSpec, parse_spec


@dataclass(frozen=True)
class UserRecord:
    id: int
    name: str
    role: Role
    created_at: datetime

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN

    @property
    def sees_all_jobs(self) -> bool:
        """Admins and viewers read every job; users read their own."""
        return self.role in (Role.ADMIN, Role.VIEWER)


@dataclass(frozen=True)
class TokenRecord:
    """An API token as listed: never the token itself (only its digest is stored)."""

    id: int
    user: str
    label: str
    created_at: datetime
    revoked: bool


@dataclass(frozen=True)
class JobRecord:
    id: str
    seq: int
    name: str
    owner: str
    state: JobState
    priority: int
    spec_doc: dict[str, Any] | None  # as stored; None on list rows, which leave it out
    submission_id: str | None
    world_size: int
    total_steps: int
    created_at: datetime
    updated_at: datetime
    current_attempt: int = 0
    last_step: int | None = None
    last_loss: float | None = None
    pending_reason: dict[str, Any] | None = None
    failure_reason: str | None = None
    message: str = ""
    condition: dict[str, Any] | None = None  # the open diagnosis (JobCondition.to_dict())

    @cached_property
    def spec(self) -> JobSpec:
        """The job's spec, parsed once from the stored document."""
        if self.spec_doc is None:
            raise ValueError(f"job {self.id} was read without its spec (a list row); "
                             "read it with get_job")
        return parse_spec(self.spec_doc)

    @property
    def status(self) -> str:
        """Where the job is now, in one line (orchestrator/jobs/status_line.py)."""
        return status_line(state=self.state, message=self.message, last_step=self.last_step,
                           total_steps=self.total_steps, pending_reason=self.pending_reason,
                           condition=self.condition)


@dataclass(frozen=True)
class EventRecord:
    id: int
    job_id: str
    at: datetime
    kind: str
    src: str | None
    dst: str | None
    reason: str | None
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AttemptRecord:
    job_id: str
    number: int
    state: str
    created_at: datetime
    ended_at: datetime | None
    failure_reason: str | None
    message: str
    placement: dict[str, Any] | None


@dataclass(frozen=True)
class RankRecord:
    job_id: str
    attempt: int
    rank: int
    node: str | None
    node_id: str | None
    gpu: int | None
    coords: dict[str, Any]
    state: str
    step: int | None
    phase: str | None
    last_heartbeat: datetime | None
    pid: int | None
    collectives: int | None = None
    progress_first_at: datetime | None = None
    progress_at: datetime | None = None


@dataclass(frozen=True)
class MetricRecord:
    job_id: str
    attempt: int
    rank: int
    step: int
    time: float
    loss: float | None
    grad_norm: float | None
    step_time_s: float | None
    tokens_per_s: float | None
    lr: float | None = None
    grad_comm_bytes: int | None = None
    grad_compression_ratio: float | None = None
    moe_aux_loss: float | None = None


@dataclass(frozen=True)
class RankUsageRecord:
    job_id: str
    attempt: int
    rank: int
    node: str | None
    at: float
    cpu_percent: float | None
    rss_bytes: int | None
    gpu_util: float | None
    gpu_mem_bytes: int | None
    gpu_mem_total_bytes: int | None


@dataclass(frozen=True)
class NodeUsageRecord:
    node: str
    at: float
    cpu_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    gpus: list[dict[str, Any]]


@dataclass(frozen=True)
class CheckpointRecord:
    job_id: str
    attempt: int
    step: int
    at: datetime
    size_bytes: int | None
    path: str
    removed: bool


@dataclass(frozen=True)
class StackRequestRecord:
    id: int
    job_id: str
    attempt: int
    requested_by: str
    requested_at: datetime
    state: str
    finished_at: datetime | None
    result: dict[str, Any] | None


@dataclass(frozen=True)
class LogRecord:
    id: int
    job_id: str
    attempt: int
    rank: int | None
    at: datetime
    stream: str
    line: str


@dataclass(frozen=True)
class DiagnosisRecord:
    id: int
    job_id: str
    attempt: int
    created_at: datetime
    verdict: str
    culprit_ranks: list[int]
    summary: str
    report: dict[str, Any]


@dataclass(frozen=True)
class NodeRecord:
    name: str
    node_id: str | None
    alive: bool
    labels: dict[str, Any]
    gpus: int
    cpus: float
    topology: dict[str, Any]
    updated_at: datetime
