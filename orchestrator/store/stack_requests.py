""""Stacks now" requests: the API records one, the leader's poller has the attempt's controller
collect every rank's stacks and stores the grouped answer (orchestrator/watchdog/stacks.py).

States: pending (recorded) -> collecting (sent to the controller) -> done | failed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update

from orchestrator.store import models as m
from orchestrator.store import records as r
from orchestrator.store.base import StoreBase

OPEN_STATES = ("pending", "collecting")


class StackRequestBusy(Exception):
    """The job already has a stacks request being answered."""

    def __init__(self, request_id: int) -> None:
        super().__init__(f"stacks request {request_id} for this job is still being collected")
        self.request_id = request_id


def _record(x: m.StackRequest) -> r.StackRequestRecord:
    return r.StackRequestRecord(id=x.id, job_id=x.job_id, attempt=x.attempt,
                                requested_by=x.requested_by, requested_at=x.requested_at,
                                state=x.state, finished_at=x.finished_at, result=x.result)


class StackRequestOps(StoreBase):
    def request_stacks(self, job_id: str, *, attempt: int, requested_by: str
                       ) -> r.StackRequestRecord:
        """Records a request; raises StackRequestBusy while the job has an open one (one at a
        time per job keeps the cost of the button bounded)."""
        with self._tx() as s:
            lock = select(m.Job.seq).where(m.Job.id == job_id)
            s.scalar(lock.with_for_update() if self.is_postgres else lock)  # one at a time
            busy = s.scalar(select(m.StackRequest.id).where(
                m.StackRequest.job_id == job_id, m.StackRequest.state.in_(OPEN_STATES)))
            if busy is not None:
                raise StackRequestBusy(busy)
            row = m.StackRequest(job_id=job_id, attempt=attempt, requested_by=requested_by,
                                 requested_at=datetime.now(UTC), state="pending", result=None)
            s.add(row)
            s.flush()
            return _record(row)

    def open_stack_requests(self) -> list[r.StackRequestRecord]:
        stmt = (select(m.StackRequest).where(m.StackRequest.state.in_(OPEN_STATES))
                .order_by(m.StackRequest.id))
        with self._tx() as s:
            return [_record(x) for x in s.scalars(stmt)]

    def update_stack_request(self, request_id: int, *, state: str,
                             result: dict[str, Any] | None = None) -> None:
        values: dict[str, Any] = {"state": state}
        if state in ("done", "failed"):
            values.update(finished_at=datetime.now(UTC), result=result)
        with self._tx() as s:
            s.execute(update(m.StackRequest).where(m.StackRequest.id == request_id)
                      .values(**values))

    def get_stack_request(self, job_id: str, request_id: int) -> r.StackRequestRecord | None:
        with self._tx() as s:
            x = s.scalar(select(m.StackRequest).where(m.StackRequest.job_id == job_id,
                                                      m.StackRequest.id == request_id))
            return _record(x) if x is not None else None

    def list_stack_requests(self, job_id: str, *, limit: int = 10
                            ) -> list[r.StackRequestRecord]:
        """Newest first."""
        stmt = (select(m.StackRequest).where(m.StackRequest.job_id == job_id)
                .order_by(m.StackRequest.id.desc()).limit(max(1, min(limit, 100))))
        with self._tx() as s:
            return [_record(x) for x in s.scalars(stmt)]
