"""Attempts, ranks, metrics, logs, diagnoses, the controller poll cursor and cluster nodes.

Written only by the control plane (the runtime's poller); read by the API.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select, update

from orchestrator.lifecycle import LogStream
from orchestrator.store import models as m
from orchestrator.store import records as r
from orchestrator.store.base import StoreBase, attempt_record
from orchestrator.store.jobs import JobNotFound
from orchestrator.store.metric_values import FIXED_FIELDS, store_extra_values

_RANK_FIELDS = ("node", "node_id", "gpu", "coords", "state", "step", "phase", "last_heartbeat",
                "pid", "collectives", "progress_first_at", "progress_at")
_METRIC_FIELDS = FIXED_FIELDS


def _rank(x: m.Rank) -> r.RankRecord:
    return r.RankRecord(job_id=x.job_id, attempt=x.attempt, rank=x.rank, node=x.node,
                        node_id=x.node_id, gpu=x.gpu, coords=x.coords or {}, state=x.state,
                        step=x.step, phase=x.phase, last_heartbeat=x.last_heartbeat, pid=x.pid,
                        collectives=x.collectives, progress_first_at=x.progress_first_at,
                        progress_at=x.progress_at)


def _node(n: m.ClusterNodeRow) -> r.NodeRecord:
    return r.NodeRecord(name=n.name, node_id=n.node_id, alive=n.alive, labels=n.labels or {},
                        gpus=n.gpus, cpus=n.cpus, topology=n.topology or {},
                        updated_at=n.updated_at)


class TelemetryOps(StoreBase):
    # -- attempts -------------------------------------------------------------------------
    def start_attempt(self, job_id: str, *, placement: dict[str, Any] | None) -> r.AttemptRecord:
        with self._tx() as s:
            job = s.scalar(select(m.Job).where(m.Job.id == job_id))
            if job is None:
                raise JobNotFound(job_id)
            job.current_attempt += 1
            a = m.Attempt(job_id=job_id, number=job.current_attempt, state="RUNNING",
                          created_at=datetime.now(UTC), placement=placement, message="", cursor=0)
            s.add(a)
            s.flush()
            return attempt_record(a)

    def end_attempt(self, job_id: str, number: int, *, state: str,
                    failure_reason: str | None = None, message: str = "") -> None:
        with self._tx() as s:
            s.execute(update(m.Attempt)
                      .where(m.Attempt.job_id == job_id, m.Attempt.number == number)
                      .values(state=state, failure_reason=failure_reason, message=message,
                              ended_at=datetime.now(UTC)))

    def list_attempts(self, job_id: str) -> list[r.AttemptRecord]:
        stmt = select(m.Attempt).where(m.Attempt.job_id == job_id).order_by(m.Attempt.number)
        with self._tx() as s:
            return [attempt_record(a) for a in s.scalars(stmt)]

    def get_cursor(self, job_id: str, attempt: int) -> int:
        with self._tx() as s:
            cur = s.scalar(select(m.Attempt.cursor).where(m.Attempt.job_id == job_id,
                                                          m.Attempt.number == attempt))
            return int(cur or 0)

    def set_cursor(self, job_id: str, attempt: int, cursor: int) -> None:
        with self._tx() as s:
            s.execute(update(m.Attempt)
                      .where(m.Attempt.job_id == job_id, m.Attempt.number == attempt)
                      .values(cursor=cursor))

    # -- ranks ----------------------------------------------------------------------------
    def upsert_ranks(self, job_id: str, attempt: int, ranks: list[dict[str, Any]]) -> None:
        with self._tx() as s:
            existing = {x.rank: x for x in s.scalars(
                select(m.Rank).where(m.Rank.job_id == job_id, m.Rank.attempt == attempt))}
            for item in ranks:
                row = existing.get(item["rank"])
                if row is None:
                    row = m.Rank(job_id=job_id, attempt=attempt, rank=item["rank"], coords={},
                                 state="PENDING")
                    s.add(row)
                    existing[item["rank"]] = row
                for key in _RANK_FIELDS:
                    if key in item:
                        setattr(row, key, item[key])

    def list_ranks(self, job_id: str, *, attempt: int | None = None) -> list[r.RankRecord]:
        with self._tx() as s:
            if attempt is None:
                attempt = s.scalar(select(m.Job.current_attempt).where(m.Job.id == job_id)) or 0
            stmt = (select(m.Rank).where(m.Rank.job_id == job_id, m.Rank.attempt == attempt)
                    .order_by(m.Rank.rank))
            return [_rank(x) for x in s.scalars(stmt)]

    def rank_zero_rows(self, job_id: str) -> list[r.RankRecord]:
        """Rank 0's row of every attempt, oldest attempt first."""
        with self._tx() as s:
            stmt = (select(m.Rank).where(m.Rank.job_id == job_id, m.Rank.rank == 0)
                    .order_by(m.Rank.attempt))
            return [_rank(x) for x in s.scalars(stmt)]

    # -- metrics --------------------------------------------------------------------------
    def add_metrics(self, job_id: str, attempt: int, rows: list[dict[str, Any]], *,
                    cursor: int | None = None) -> None:
        """Appends metric points (their metrics beyond the fixed columns as metric_values);
        the job's last_step / last_loss follow the newest step. With `cursor`, the attempt's
        poll cursor advances in the same transaction."""
        if not rows:
            return
        values = [{"job_id": job_id, "attempt": attempt, "rank": int(x.get("rank", 0)),
                   "step": int(x["step"]), "time": float(x["time"]),
                   **{k: x.get(k) for k in _METRIC_FIELDS}} for x in rows]
        newest = max(values, key=lambda v: v["step"])
        with self._tx() as s:
            s.execute(m.Metric.__table__.insert(), values)
            store_extra_values(s, job_id, attempt, rows)
            job = s.scalar(select(m.Job).where(m.Job.id == job_id))
            if job is None:
                raise JobNotFound(job_id)
            if job.last_step is None or newest["step"] >= job.last_step:
                job.last_step = newest["step"]
                if newest.get("loss") is not None:
                    job.last_loss = newest["loss"]
            self._advance_cursor(s, job_id, attempt, cursor)

    def add_missing_metrics(self, job_id: str, attempt: int,
                            rows: list[dict[str, Any]]) -> int:
        """Inserts the rows past the newest step stored for their (attempt, rank), in one
        transaction (so repeating it adds nothing); returns how many were added."""
        with self._tx() as s:
            newest = {rank: step for rank, step in s.execute(
                select(m.Metric.rank, func.max(m.Metric.step))
                .where(m.Metric.job_id == job_id, m.Metric.attempt == attempt)
                .group_by(m.Metric.rank))}
            seen: dict[int, int] = {}
            values, kept = [], []
            for x in sorted(rows, key=lambda x: (int(x.get("rank", 0)), int(x["step"]))):
                rank, step = int(x.get("rank", 0)), int(x["step"])
                stored = newest.get(rank)
                floor = max(-1 if stored is None else stored, seen.get(rank, -1))
                if step <= floor:
                    continue
                seen[rank] = step
                kept.append(dict(x, rank=rank))
                values.append({"job_id": job_id, "attempt": attempt, "rank": rank,
                               "step": step, "time": float(x["time"]),
                               **{k: x.get(k) for k in _METRIC_FIELDS}})
            if not values:
                return 0
            s.execute(m.Metric.__table__.insert(), values)
            store_extra_values(s, job_id, attempt, kept)
            job = s.scalar(select(m.Job).where(m.Job.id == job_id))
            if job is None:
                raise JobNotFound(job_id)
            top = max(values, key=lambda v: v["step"])
            if job.last_step is None or top["step"] >= job.last_step:
                job.last_step = top["step"]
                if top.get("loss") is not None:
                    job.last_loss = top["loss"]
            return len(values)

    def list_metrics(self, job_id: str, *, rank: int | None = None,
                     after_step: int | None = None, limit: int = 10_000) -> list[r.MetricRecord]:
        stmt = select(m.Metric).where(m.Metric.job_id == job_id)
        if rank is not None:
            stmt = stmt.where(m.Metric.rank == rank)
        if after_step is not None:
            stmt = stmt.where(m.Metric.step > after_step)
        stmt = stmt.order_by(m.Metric.step, m.Metric.rank, m.Metric.id).limit(
            max(1, min(limit, 100_000)))
        with self._tx() as s:
            return [r.MetricRecord(job_id=x.job_id, attempt=x.attempt, rank=x.rank, step=x.step,
                                   time=x.time, **{k: getattr(x, k) for k in _METRIC_FIELDS})
                    for x in s.scalars(stmt)]

    # -- logs -----------------------------------------------------------------------------
    def add_logs(self, job_id: str, attempt: int, lines: list[dict[str, Any]], *,
                 cursor: int | None = None) -> None:
        if not lines:
            return
        now = datetime.now(UTC)
        values = [{"job_id": job_id, "attempt": attempt, "rank": x.get("rank"),
                   "at": x.get("at") or now, "stream": x.get("stream", LogStream.STDOUT.value),
                   "line": str(x["line"])} for x in lines]
        with self._tx() as s:
            s.execute(m.LogLine.__table__.insert(), values)
            self._advance_cursor(s, job_id, attempt, cursor)

    def list_logs(self, job_id: str, *, rank: int | None = None, after: int = 0,
                  limit: int = 1000, tail: int | None = None, attempt: int | None = None,
                  stream: str | None = None, contains: str | None = None,
                  before: int | None = None) -> list[r.LogRecord]:
        """Lines in id order. `tail` (or `before`, an id) reads the newest matching lines
        first, so a page of older lines is `before=<oldest id shown>`."""
        stmt = select(m.LogLine).where(m.LogLine.job_id == job_id, m.LogLine.id > after)
        if rank is not None:
            stmt = stmt.where(m.LogLine.rank == rank)
        if attempt is not None:
            stmt = stmt.where(m.LogLine.attempt == attempt)
        if stream is not None:
            stmt = stmt.where(m.LogLine.stream == stream)
        if contains:
            stmt = stmt.where(m.LogLine.line.contains(contains, autoescape=True))
        if before is not None:
            stmt = stmt.where(m.LogLine.id < before)
        newest_first = bool(tail) or before is not None
        cap = max(1, min(tail or limit, 100_000))
        stmt = stmt.order_by(m.LogLine.id.desc() if newest_first else m.LogLine.id).limit(cap)
        with self._tx() as s:
            out = [r.LogRecord(id=x.id, job_id=x.job_id, attempt=x.attempt, rank=x.rank, at=x.at,
                               stream=x.stream, line=x.line) for x in s.scalars(stmt)]
        return sorted(out, key=lambda x: x.id)

    def get_diagnosis(self, job_id: str, diagnosis_id: int) -> r.DiagnosisRecord | None:
        with self._tx() as s:
            d = s.scalar(select(m.Diagnosis).where(m.Diagnosis.job_id == job_id,
                                                   m.Diagnosis.id == diagnosis_id))
            return self._diag(d) if d is not None else None

    # -- diagnoses ------------------------------------------------------------------------
    def add_diagnosis(self, job_id: str, attempt: int, *, verdict: str, culprit_ranks: list[int],
                      summary: str, report: dict[str, Any]) -> r.DiagnosisRecord:
        with self._tx() as s:
            d = m.Diagnosis(job_id=job_id, attempt=attempt, created_at=datetime.now(UTC),
                            verdict=verdict, culprit_ranks={"ranks": list(culprit_ranks)},
                            summary=summary, report=report)
            s.add(d)
            s.flush()
            return self._diag(d)

    @staticmethod
    def _diag(d: m.Diagnosis) -> r.DiagnosisRecord:
        return r.DiagnosisRecord(id=d.id, job_id=d.job_id, attempt=d.attempt,
                                 created_at=d.created_at, verdict=d.verdict,
                                 culprit_ranks=list((d.culprit_ranks or {}).get("ranks", [])),
                                 summary=d.summary, report=d.report)

    def list_diagnoses(self, job_id: str) -> list[r.DiagnosisRecord]:
        stmt = select(m.Diagnosis).where(m.Diagnosis.job_id == job_id).order_by(m.Diagnosis.id)
        with self._tx() as s:
            return [self._diag(d) for d in s.scalars(stmt)]

    # -- cluster nodes --------------------------------------------------------------------
    def upsert_node(self, *, name: str, node_id: str | None = None, alive: bool = True,
                    labels: dict[str, Any] | None = None, gpus: int = 0, cpus: float = 0.0,
                    topology: dict[str, Any] | None = None) -> r.NodeRecord:
        with self._tx() as s:
            if node_id is not None:  # a node id moved to a new name: keep one row per id
                s.execute(delete(m.ClusterNodeRow).where(m.ClusterNodeRow.node_id == node_id,
                                                         m.ClusterNodeRow.name != name))
            row = s.get(m.ClusterNodeRow, name)
            if row is None:
                row = m.ClusterNodeRow(name=name)
                s.add(row)
            row.node_id, row.alive, row.labels = node_id, alive, labels or {}
            row.gpus, row.cpus, row.topology = gpus, cpus, topology or {}
            row.updated_at = datetime.now(UTC)
            s.flush()
            return _node(row)

    def mark_nodes_dead(self, *, except_names: set[str]) -> None:
        with self._tx() as s:
            s.execute(update(m.ClusterNodeRow).where(m.ClusterNodeRow.name.not_in(except_names))
                      .values(alive=False))

    def list_nodes(self) -> list[r.NodeRecord]:
        with self._tx() as s:
            return [_node(n) for n in s.scalars(select(m.ClusterNodeRow)
                                                .order_by(m.ClusterNodeRow.name))]
