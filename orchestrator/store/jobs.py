"""Jobs and their events: submission (idempotent), listing (stable cursors), transitions."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.admission.quotas import Quota, check_queued
from orchestrator.bounds.limits import INT64_MAX
from orchestrator.lifecycle import (
    ACTIVE_STATES,
    AttemptState,
    JobEventKind,
    JobState,
    Reason,
    can_transition,
    transition,
)
from orchestrator.spec import JobSpec
from orchestrator.store import models as m
from orchestrator.store.base import StoreBase, attempt_record, event_record, job_record
from orchestrator.store.records import AttemptRecord, EventRecord, JobRecord, UserRecord

# A state move a caller asks for: (to, reason, message, event data).
Move = tuple[JobState, Reason, str, dict[str, Any] | None]

MAX_PAGE = 500
_SUMMARY_COLUMNS = [c for c in m.Job.__table__.c if c.name != "spec"]


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} not found")
        self.job_id = job_id


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class JobFacts:
    """What a job's events say about it beyond its row (`JobOps.job_facts`)."""

    started_at: datetime | None = None  # when it first entered RUNNING
    cancelled_by: str | None = None  # who asked to cancel it


# A cancel event's message names who asked ("cancel requested by ana", "cancelled by ana
# while queued"); events recorded before the name went into their data are read from it.
_CANCELLED_BY = re.compile(r"^(?:cancel requested|cancelled) by (\S+)")


class _Raced(Exception):
    """Another writer changed the job's state between our read and our write."""


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"s": seq}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        pad = "=" * (-len(cursor) % 4)
        seq = json.loads(base64.urlsafe_b64decode(cursor + pad))["s"]
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= INT64_MAX:
            raise TypeError  # a seq no row can have (and no column can bind)
        return seq
    except (ValueError, KeyError, TypeError) as exc:
        raise BadCursor("invalid cursor; pass the next_cursor value of a previous page") from exc


def _owner_lock_key(owner: str) -> int:
    digest = hashlib.sha256(f"meshyard.submit:{owner}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def new_job_id() -> str:
    return "job-" + secrets.token_hex(6)


def _visible(stmt: Any, viewer: UserRecord | None) -> Any:
    if viewer is not None and not viewer.sees_all_jobs:
        stmt = stmt.where(m.Job.owner == viewer.name)
    return stmt


class JobOps(StoreBase):
    def submit_job(self, spec: JobSpec, *, owner: str, submission_id: str | None = None,
                   max_queued: int | None = None) -> tuple[JobRecord, bool]:
        """Stores a QUEUED job with its SUBMITTED event. A repeated (owner, submission_id)
        returns the existing job and False, also when two retries race. With `max_queued`,
        raises QuotaExceeded (nothing stored) when the owner already has that many queued."""
        if submission_id:
            existing = self._by_submission(owner, submission_id)
            if existing is not None:
                return existing, False
        now = datetime.now(UTC)
        try:
            with self._tx() as s:
                if max_queued is not None and self.is_postgres:
                    # One submitter per owner at a time, so concurrent ones count each other.
                    s.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                              {"k": _owner_lock_key(owner)})
                job = m.Job(
                    id=new_job_id(), name=spec.name, owner=owner, state=JobState.QUEUED.value,
                    priority=spec.priority, spec=spec.model_dump(mode="json"),
                    submission_id=submission_id, world_size=spec.world_size,
                    total_steps=spec.total_steps, created_at=now, updated_at=now, message="",
                )
                s.add(job)
                s.flush()
                if max_queued is not None:
                    # Counted after the insert: on SQLite the insert took the write lock, so
                    # no other submission can slip in between (our own row is counted too).
                    check_queued(Quota(max_queued_jobs=max_queued),
                                 queued=self._queued(s, owner) - 1)
                s.add(m.Event(job_id=job.id, at=now, kind="state", src=None,
                              dst=JobState.QUEUED.value, reason=Reason.SUBMITTED.value,
                              message=f"submitted by {owner}", data={}))
                s.flush()
                return job_record(job), True
        except IntegrityError:
            if submission_id:
                existing = self._by_submission(owner, submission_id)
                if existing is not None:
                    return existing, False
            raise

    @staticmethod
    def _queued(s: Session, owner: str) -> int:
        return int(s.scalar(select(func.count()).select_from(m.Job).where(
            m.Job.owner == owner, m.Job.state == JobState.QUEUED.value)) or 0)

    def _by_submission(self, owner: str, submission_id: str) -> JobRecord | None:
        with self._tx() as s:
            job = s.scalar(select(m.Job).where(m.Job.owner == owner,
                                               m.Job.submission_id == submission_id))
            return job_record(job) if job else None

    def get_job(self, job_id: str, *, viewer: UserRecord | None = None) -> JobRecord | None:
        with self._tx() as s:
            job = s.scalar(_visible(select(m.Job).where(m.Job.id == job_id), viewer))
            return job_record(job) if job else None

    def list_jobs(self, *, viewer: UserRecord | None, state: list[str] | None = None,
                  owner: str | None = None, name: str | None = None, limit: int = 50,
                  cursor: str | None = None, condition: str | None = None,
                  with_spec: bool = True) -> tuple[list[JobRecord], str | None]:
        """Newest first. The cursor is the last seen seq, so jobs submitted while a client
        pages never shift later pages. `condition` ("hung", "straggling"): only jobs whose
        open diagnosis says so. with_spec=False leaves `spec` empty ({}) and reads plain
        rows instead of ORM objects: a listing shows no specs, and decoding 50 of them plus
        building 50 ORM instances was ~2/3 of a page's server time."""
        limit = max(1, min(limit, MAX_PAGE))
        stmt = _visible(select(m.Job) if with_spec else select(*_SUMMARY_COLUMNS), viewer)
        if state:
            stmt = stmt.where(m.Job.state.in_([JobState(s).value for s in state]))
        if condition:
            stmt = stmt.where(m.Job.condition["kind"].as_string() == condition)
        if owner:
            stmt = stmt.where(m.Job.owner == owner)
        if name:
            stmt = stmt.where(m.Job.name.contains(name, autoescape=True))
        if cursor:
            stmt = stmt.where(m.Job.seq < decode_cursor(cursor))
        stmt = stmt.order_by(m.Job.seq.desc()).limit(limit + 1)
        with self._tx() as s:
            records = [job_record(j) for j in s.scalars(stmt)] if with_spec else \
                [JobRecord(**{**row._mapping, "state": JobState(row.state)}, spec_doc=None)
                 for row in s.execute(stmt)]
        more = len(records) > limit
        records = records[:limit]
        return records, (encode_cursor(records[-1].seq) if more else None)

    def job_facts(self, job_ids: Sequence[str]) -> dict[str, JobFacts]:
        """Per job, from its state events: when it first ran (entered RUNNING) and who asked
        to cancel it. Jobs with neither are left out."""
        if not job_ids:
            return {}
        ids = list(dict.fromkeys(job_ids))[:MAX_PAGE]
        started = (select(m.Event.job_id, func.min(m.Event.at))
                   .where(m.Event.job_id.in_(ids), m.Event.kind == JobEventKind.STATE.value,
                          m.Event.dst == JobState.RUNNING.value)
                   .group_by(m.Event.job_id))
        cancels = (select(m.Event.job_id, m.Event.message, m.Event.data)
                   .where(m.Event.job_id.in_(ids), m.Event.kind == JobEventKind.STATE.value,
                          m.Event.reason == Reason.USER_CANCELLED.value)
                   .order_by(m.Event.id))
        out: dict[str, JobFacts] = {}
        with self._tx() as s:
            for job_id, at in s.execute(started):
                out[job_id] = JobFacts(started_at=at)
            for job_id, message, data in s.execute(cancels):
                by = (data or {}).get("by") if isinstance(data, dict) else None
                if not isinstance(by, str):
                    found = _CANCELLED_BY.search(message or "")
                    by = found.group(1) if found else None
                if by and out.get(job_id, JobFacts()).cancelled_by is None:
                    out[job_id] = replace(out.get(job_id, JobFacts()), cancelled_by=by)
        return out

    def _locked_job(self, s: Session, job_id: str) -> m.Job:
        stmt = select(m.Job).where(m.Job.id == job_id)
        if self.is_postgres:
            stmt = stmt.with_for_update()
        job = s.scalar(stmt)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def _apply(self, s: Session, job: m.Job, dst: JobState, *, reason: Reason, message: str,
               data: dict[str, Any] | None) -> None:
        ev = transition(JobState(job.state), dst, reason=reason, message=message, data=data)
        values: dict[str, Any] = {"state": ev.dst.value, "updated_at": ev.at, "message": message}
        if dst == JobState.FAILED:
            values["failure_reason"] = reason.value
        if dst != JobState.QUEUED:
            values["pending_reason"] = None
        if dst.terminal or dst in (JobState.QUEUED, JobState.RESTARTING):
            values["condition"] = None  # the attempt it described is over
        # Compare-and-set on the state we validated against: SQLite has no SELECT ... FOR
        # UPDATE, so two writers may both read the old state; only one UPDATE matches.
        res = s.execute(update(m.Job).where(m.Job.seq == job.seq, m.Job.state == ev.src.value)
                        .values(**values).execution_options(synchronize_session=False))
        if res.rowcount != 1:
            raise _Raced
        s.add(m.Event(job_id=job.id, at=ev.at, kind=JobEventKind.STATE, src=ev.src.value,
                      dst=ev.dst.value,
                      reason=ev.reason.value, message=message, data=ev.data))
        s.flush()
        s.refresh(job)

    def _retrying(self, fn: Any) -> Any:
        for _ in range(20):
            try:
                return fn()
            except _Raced:
                continue  # re-read the state the winner wrote; the move may now be illegal
        raise RuntimeError("job state kept changing under concurrent writers")

    def transition(self, job_id: str, dst: JobState, *, reason: Reason, message: str = "",
                   data: dict[str, Any] | None = None) -> JobRecord:
        """The only writer of job state: the state and its event commit together.
        Raises IllegalTransition (nothing written) for a move the lifecycle forbids."""
        def once() -> JobRecord:
            with self._tx() as s:
                job = self._locked_job(s, job_id)
                self._apply(s, job, JobState(dst), reason=Reason(reason), message=message,
                            data=data)
                return job_record(job)

        return self._retrying(once)

    def fail_attempt(self, job_id: str, number: int, *, failure_reason: str, message: str,
                     data: dict[str, Any],
                     decide: Callable[[JobRecord, list[AttemptRecord]], Sequence[Move]]
                     ) -> bool:
        """Records attempt `number`'s failure in one transaction: the attempt ends FAILED, an
        error event carries `data`, and the moves `decide` returns (from the job and its
        attempts, this one already failed) are applied. An attempt already ended is left as
        it is (a replayed report): False. A move the lifecycle forbids is skipped."""
        def once() -> bool:
            with self._tx() as s:
                job = self._locked_job(s, job_id)
                row = s.scalars(select(m.Attempt).where(m.Attempt.job_id == job_id,
                                                        m.Attempt.number == number)).first()
                if row is not None and row.ended_at is not None:
                    return False
                now = datetime.now(UTC)
                if row is not None:
                    row.state, row.failure_reason = AttemptState.FAILED.value, failure_reason
                    row.message, row.ended_at = message, now
                s.add(m.Event(job_id=job_id, at=now, kind=JobEventKind.ERROR, src=None, dst=None,
                              reason=failure_reason, message=f"attempt {number} failed: "
                              f"{message}", data=data))
                s.flush()
                attempts = [attempt_record(a) for a in s.scalars(
                    select(m.Attempt).where(m.Attempt.job_id == job_id)
                    .order_by(m.Attempt.number))]
                for dst, reason, text_, move_data in decide(job_record(job), attempts):
                    if not can_transition(JobState(job.state), dst):
                        continue
                    self._apply(s, job, dst, reason=reason, message=text_, data=move_data)
                return True

        return bool(self._retrying(once))

    def request_cancel(self, job_id: str, *, viewer: UserRecord | None) -> JobRecord:
        """QUEUED → CANCELLED at once; an active job → CANCELLING (the runtime finishes it);
        CANCELLING or terminal: unchanged, so repeating a cancel is harmless."""
        if self.get_job(job_id, viewer=viewer) is None:
            raise JobNotFound(job_id)
        who = viewer.name if viewer else "system"

        def once() -> JobRecord:
            with self._tx() as s:
                job = self._locked_job(s, job_id)
                state = JobState(job.state)
                if state == JobState.QUEUED:
                    self._apply(s, job, JobState.CANCELLED, reason=Reason.USER_CANCELLED,
                                message=f"cancelled by {who} while queued", data={"by": who})
                elif state in ACTIVE_STATES and state != JobState.CANCELLING:
                    self._apply(s, job, JobState.CANCELLING, reason=Reason.USER_CANCELLED,
                                message=f"cancel requested by {who}", data={"by": who})
                return job_record(job)

        return self._retrying(once)

    def add_event(self, job_id: str, *, kind: JobEventKind | str, message: str,
                  reason: str | None = None, data: dict[str, Any] | None = None
                  ) -> EventRecord:
        if kind not in (JobEventKind.INFO, JobEventKind.WARNING, JobEventKind.ERROR):
            raise ValueError(f"event kind {kind!r} must be info, warning or error "
                             "(state events come from transition())")
        kind = JobEventKind(kind)
        with self._tx() as s:
            self._locked_job(s, job_id)
            ev = m.Event(job_id=job_id, at=datetime.now(UTC), kind=kind, src=None, dst=None,
                         reason=reason, message=message, data=data or {})
            s.add(ev)
            s.flush()
            return event_record(ev)

    def list_events(self, job_id: str, *, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        stmt = (select(m.Event).where(m.Event.job_id == job_id, m.Event.id > after)
                .order_by(m.Event.id).limit(max(1, min(limit, 10_000))))
        with self._tx() as s:
            return [event_record(e) for e in s.scalars(stmt)]

    def set_pending_reason(self, job_id: str, reason: dict[str, Any] | None) -> None:
        with self._tx() as s:
            job = self._locked_job(s, job_id)
            job.pending_reason = reason

    def set_condition(self, job_id: str, condition: dict[str, Any] | None) -> None:
        """The job's open diagnosis (orchestrator/watchdog/condition.py), or None."""
        with self._tx() as s:
            job = self._locked_job(s, job_id)
            job.condition = condition

    def queued_jobs(self) -> list[JobRecord]:
        stmt = (select(m.Job).where(m.Job.state == JobState.QUEUED.value)
                .order_by(m.Job.priority.desc(), m.Job.seq))
        with self._tx() as s:
            return [job_record(j) for j in s.scalars(stmt)]

    def active_jobs(self) -> list[JobRecord]:
        stmt = (select(m.Job).where(m.Job.state.in_([x.value for x in ACTIVE_STATES]))
                .order_by(m.Job.seq))
        with self._tx() as s:
            return [job_record(j) for j in s.scalars(stmt)]

    def job_counts_by_state(self) -> dict[str, int]:
        with self._tx() as s:
            rows = s.execute(select(m.Job.state, func.count()).group_by(m.Job.state)).all()
        counts = {st.value: 0 for st in JobState}
        counts.update({state: n for state, n in rows})
        return counts
