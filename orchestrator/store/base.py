"""Shared session plumbing and row → record conversion for the store mixins."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission.access import Role
from orchestrator.lifecycle import JobState
from orchestrator.store import models as m
from orchestrator.store import records as r


class StoreBase:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        """One transaction: commit on success, roll back on error."""
        with self._sessions.begin() as session:
            yield session

    @staticmethod
    def _advance_cursor(s: Any, job_id: str, attempt: int, cursor: int | None) -> None:
        """Moves an attempt's poll cursor, in the transaction of the rows it covers, so a
        control plane killed between the two can neither lose nor duplicate a batch."""
        if cursor is not None:
            s.execute(update(m.Attempt)
                      .where(m.Attempt.job_id == job_id, m.Attempt.number == attempt,
                             m.Attempt.cursor < cursor)
                      .values(cursor=cursor))

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"


def job_record(j: m.Job) -> r.JobRecord:
    return r.JobRecord(
        id=j.id, seq=j.seq, name=j.name, owner=j.owner, state=JobState(j.state),
        priority=j.priority, spec_doc=j.spec, submission_id=j.submission_id,
        world_size=j.world_size,
        total_steps=j.total_steps, created_at=j.created_at, updated_at=j.updated_at,
        current_attempt=j.current_attempt, last_step=j.last_step, last_loss=j.last_loss,
        pending_reason=j.pending_reason, failure_reason=j.failure_reason, message=j.message,
        condition=j.condition,
    )


def event_record(e: m.Event) -> r.EventRecord:
    return r.EventRecord(id=e.id, job_id=e.job_id, at=e.at, kind=e.kind, src=e.src, dst=e.dst,
                         reason=e.reason, message=e.message, data=e.data or {})


def user_record(u: m.User) -> r.UserRecord:
    return r.UserRecord(id=u.id, name=u.name, role=Role(u.role), created_at=u.created_at)


def attempt_record(a: m.Attempt) -> r.AttemptRecord:
    return r.AttemptRecord(job_id=a.job_id, number=a.number, state=a.state,
                           created_at=a.created_at, ended_at=a.ended_at,
                           failure_reason=a.failure_reason, message=a.message,
                           placement=a.placement)
