"""SQLAlchemy 2.0 typed models. Every change here needs an Alembic migration in migrations/.

Timestamps are timezone-aware UTC. JSON columns hold specs, placements, topology and reports.
Metrics are one row per (job, attempt, rank, step): indexed by (job_id, step) so a job's series
reads fast, and never joined by the job list (jobs carry last_step / last_loss).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY; BigInteger elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend (SQLite drops tzinfo; we put it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored; use datetime.now(UTC)")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime()}


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    role: Mapped[str] = mapped_column(String(16), default="user", server_default="user")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class DashboardSession(Base):
    """A signed-in browser. The cookie holds the secret; only its digest is stored. Ends at
    logout, at `expires_at`, or when the token it was opened with is revoked."""

    __tablename__ = "dashboard_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"),
                                          index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)


class UserQuota(Base):
    """Limits an admin set for one user; a NULL limit falls back to the server's default."""

    __tablename__ = "user_quotas"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                         primary_key=True)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer)
    max_running_gpus: Mapped[int | None] = mapped_column(Integer)
    max_running_cpus: Mapped[float | None] = mapped_column(Float)
    max_priority: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    owner: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[dict[str, Any]]
    submission_id: Mapped[str | None] = mapped_column(String(200))
    world_size: Mapped[int] = mapped_column(Integer)
    total_steps: Mapped[int] = mapped_column(Integer)
    current_attempt: Mapped[int] = mapped_column(Integer, default=0)
    last_step: Mapped[int | None] = mapped_column(Integer)
    last_loss: Mapped[float | None] = mapped_column(Float)
    pending_reason: Mapped[dict[str, Any] | None]
    failure_reason: Mapped[str | None] = mapped_column(String(40))
    message: Mapped[str] = mapped_column(Text, default="")
    # The open diagnosis of the current attempt (orchestrator/watchdog/condition.py): set
    # when the watchdog reports, cleared when progress resumes or the attempt ends.
    condition: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    __table_args__ = (
        UniqueConstraint("owner", "submission_id", name="uq_jobs_owner_submission"),
        Index("ix_jobs_state_priority", "state", "priority", "seq"),
        Index("ix_jobs_owner_seq", "owner", "seq"),
    )


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(16))
    src: Mapped[str | None] = mapped_column(String(16))
    dst: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(40))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]]
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)


class Attempt(Base):
    __tablename__ = "attempts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    failure_reason: Mapped[str | None] = mapped_column(String(40))
    message: Mapped[str] = mapped_column(Text, default="")
    placement: Mapped[dict[str, Any] | None]
    cursor: Mapped[int] = mapped_column(BigInteger, default=0)
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),)


class Rank(Base):
    __tablename__ = "ranks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(String(200))
    node_id: Mapped[str | None] = mapped_column(String(64))
    gpu: Mapped[int | None] = mapped_column(Integer)
    coords: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16))
    step: Mapped[int | None] = mapped_column(Integer)
    phase: Mapped[str | None] = mapped_column(String(32))
    last_heartbeat: Mapped[datetime | None]
    pid: Mapped[int | None] = mapped_column(Integer)
    # a script that reports no steps: the collectives its probe saw enqueued, when the first
    # was seen and when the count last grew (its progress)
    collectives: Mapped[int | None] = mapped_column(BigInteger)
    progress_first_at: Mapped[datetime | None]
    progress_at: Mapped[datetime | None]
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "rank", name="uq_ranks_job_attempt_rank"),
    )


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)
    # DDP gradient compression: bytes one rank handed to the gradient collectives this step,
    # and dense fp32 payload / that (every DDP job reports them, 1.0 without a comm hook)
    grad_comm_bytes: Mapped[int | None] = mapped_column(BigInteger)
    grad_compression_ratio: Mapped[float | None] = mapped_column(Float)
    moe_aux_loss: Mapped[float | None] = mapped_column(Float)  # MoE load-balancing loss
    __table_args__ = (Index("ix_metrics_job_step", "job_id", "step"),)


class MetricValue(Base):
    """One reported metric beyond the fixed columns of `metrics` (val_acc, mfu, anything a
    job's code reports): one (key, value) of one rank's step. Only names the job's
    `metric_keys` hold are stored (orchestrator/store/metric_values.py bounds them)."""

    __tablename__ = "metric_values"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    key: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("ix_metric_values_job_key_step", "job_id", "key", "step"),)


class MetricKey(Base):
    """A name the job's metric_values may carry; a job has at most MAX_KEYS_PER_JOB."""

    __tablename__ = "metric_keys"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RankUsage(Base):
    """One rank's process at one moment: CPU, resident memory, and its GPU when it has one.
    Written at a bounded rate (the controller samples each rank at most every few seconds)."""

    __tablename__ = "rank_usage"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(String(200))
    at: Mapped[float] = mapped_column(Float)  # unix seconds, the worker's clock
    cpu_percent: Mapped[float | None] = mapped_column(Float)
    rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_util: Mapped[float | None] = mapped_column(Float)
    gpu_mem_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_mem_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    __table_args__ = (Index("ix_rank_usage_job_at", "job_id", "at"),)


class NodeUsage(Base):
    """One node at one moment (every node, busy or idle): CPU, memory and its GPUs (NVML)."""

    __tablename__ = "node_usage"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(200))
    at: Mapped[float] = mapped_column(Float)
    cpu_percent: Mapped[float | None] = mapped_column(Float)
    mem_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    mem_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpus: Mapped[dict[str, Any]]  # {"gpus": [{index, util, mem_used_bytes, mem_total_bytes}]}
    __table_args__ = (Index("ix_node_usage_node_at", "node", "at"),
                      Index("ix_node_usage_at", "at"))


class Checkpoint(Base):
    """A complete checkpoint rank 0 reported; `removed` once `keep` pruned it from disk."""

    __tablename__ = "checkpoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(Text, default="")
    removed: Mapped[bool] = mapped_column(Boolean, default=False)
    __table_args__ = (UniqueConstraint("job_id", "attempt", "step",
                                       name="uq_checkpoints_job_attempt_step"),)


class StackRequest(Base):
    """"Stacks now": a user asked for every rank's Python stacks; the leader's poller has the
    attempt's controller collect them and stores the grouped answer in `result`."""

    __tablename__ = "stack_requests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    requested_by: Mapped[str] = mapped_column(String(128))
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(16))  # pending | collecting | done | failed
    finished_at: Mapped[datetime | None]
    result: Mapped[dict[str, Any] | None]
    __table_args__ = (Index("ix_stack_requests_job_id_id", "job_id", "id"),
                      Index("ix_stack_requests_state", "state"))


class LogLine(Base):
    __tablename__ = "log_lines"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    stream: Mapped[str] = mapped_column(String(8))
    line: Mapped[str] = mapped_column(Text)
    __table_args__ = (Index("ix_log_lines_job_rank_id", "job_id", "rank", "id"),)


class Diagnosis(Base):
    __tablename__ = "diagnoses"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    verdict: Mapped[str] = mapped_column(String(32))
    culprit_ranks: Mapped[dict[str, Any]]  # {"ranks": [...]} keeps the JSON column portable
    summary: Mapped[str] = mapped_column(Text)
    report: Mapped[dict[str, Any]]


class ClusterNodeRow(Base):
    __tablename__ = "cluster_nodes"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    node_id: Mapped[str | None] = mapped_column(String(64), unique=True)
    alive: Mapped[bool] = mapped_column(Boolean, default=True)
    labels: Mapped[dict[str, Any]]
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    cpus: Mapped[float] = mapped_column(Float, default=0.0)
    topology: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class LeaderLease(Base):
    """One row per lease name (e.g. "scheduler"): who leads until when. Used on SQLite only;
    PostgreSQL uses a session advisory lock (orchestrator/store/leader.py)."""

    __tablename__ = "leader_leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[float] = mapped_column(Float)  # epoch seconds; one machine's clock
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)


class NodeHealthRow(Base):
    """The node health ledger (orchestrator/nodes/health_policy.py): one row per node name."""

    __tablename__ = "node_health"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    node_id: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    since: Mapped[datetime | None] = mapped_column(nullable=True)
    until: Mapped[datetime | None] = mapped_column(nullable=True)
    permanent: Mapped[bool] = mapped_column(Boolean, default=False)
    cleared_at: Mapped[datetime | None] = mapped_column(nullable=True)
    gpus: Mapped[dict[str, Any]]  # {"3": until epoch s | null (permanent)}
    evidence: Mapped[dict[str, Any]]  # {"items": [Evidence.to_dict(), ...]}
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class PackageOwner(Base):
    """Who uploaded which code package (orchestrator/usercode/packages.py): a spec may name only a
    package its owner uploaded, and nobody else learns that it exists. One row per
    (package, uploader): the same bytes uploaded by two users belong to both."""

    __tablename__ = "package_owners"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
