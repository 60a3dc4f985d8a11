"""Every reported metric: the fixed columns of `metrics` and the job's own keys in
`metric_values`, stored, listed and downsampled for charts.

A job's code may report any numeric metric (`meshyard.train.report({"val_acc": ...})`, the
built-in loop's `mfu`). Names beyond the fixed columns are stored as (key, value) rows, bounded:

* at most MAX_KEYS_PER_JOB distinct names per job (the first ones reported win);
* a name is 1-64 characters of letters, digits and `_ . : / -`, starting with a letter or `_`;
* a value is a finite int or float (bools, strings and nulls are not charted: not stored).

A name refused for either reason is dropped from every row, and the job gets one warning event
(reason METRICS_DROPPED) per cause naming the first refused names; later refusals of the same
cause are dropped without another event.

`metric_series` downsamples on the database: the job's steps in the asked range are cut into
at most `points` buckets of equal width, and each (key, rank, bucket) gives its first step
and time, the mean, the minimum and the maximum, and how many rows it holds, so a spike
inside a bucket survives as its max (min-max decimation).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from orchestrator.lifecycle import JobEventKind, Reason
from orchestrator.store import models as m
from orchestrator.store.base import StoreBase

FIXED_FIELDS = ("loss", "grad_norm", "step_time_s", "tokens_per_s", "lr", "grad_comm_bytes",
                "grad_compression_ratio", "moe_aux_loss")
_META = frozenset({"rank", "step", "time", "checkpoint", "attempt"})
MAX_KEYS_PER_JOB = 64
MAX_KEY_CHARS = 64
KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}$"
_KEY_RE = re.compile(KEY_PATTERN)
_EVENT_NAMES = 10  # refused names an event lists


def valid_key(key: str) -> bool:
    return bool(_KEY_RE.match(key))


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def extra_items(row: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    """A row's numeric metrics beyond the fixed columns."""
    for k, v in row.items():
        if k in _META or k in FIXED_FIELDS:
            continue
        f = _number(v)
        if f is not None:
            yield str(k), f


def store_extra_values(s: Any, job_id: str, attempt: int,
                       rows: Sequence[Mapping[str, Any]]) -> None:
    """Inserts `rows`' extra metrics in the caller's transaction (see the module doc)."""
    pairs = [(row, k, v) for row in rows for k, v in extra_items(row)]
    if not pairs:
        return
    known = set(s.scalars(select(m.MetricKey.key).where(m.MetricKey.job_id == job_id)))
    refused: dict[str, list[str]] = {"name": [], "limit": []}
    added: list[str] = []
    for key in dict.fromkeys(k for _, k, _ in pairs):
        if key in known:
            continue
        if not valid_key(key):
            refused["name"].append(key)
        elif len(known) >= MAX_KEYS_PER_JOB:
            refused["limit"].append(key)
        else:
            known.add(key)
            added.append(key)
    if added:
        now = datetime.now(UTC)
        s.execute(m.MetricKey.__table__.insert(),
                  [{"job_id": job_id, "key": k, "created_at": now} for k in added])
    values = [{"job_id": job_id, "attempt": attempt, "rank": int(row.get("rank", 0)),
               "step": int(row["step"]), "time": float(row["time"]), "key": k, "value": v}
              for row, k, v in pairs if k in known]
    if values:
        s.execute(m.MetricValue.__table__.insert(), values)
    if refused["name"] or refused["limit"]:
        _note_refused(s, job_id, refused)


def _note_refused(s: Any, job_id: str, refused: Mapping[str, list[str]]) -> None:
    said = {(d or {}).get("cause") for d in s.scalars(
        select(m.Event.data).where(m.Event.job_id == job_id,
                                   m.Event.reason == Reason.METRICS_DROPPED.value))}
    for cause, names in refused.items():
        if not names or cause in said:
            continue
        shown = ", ".join(repr(n[:MAX_KEY_CHARS]) for n in names[:_EVENT_NAMES])
        more = f" and {len(names) - _EVENT_NAMES} more" if len(names) > _EVENT_NAMES else ""
        if cause == "limit":
            why = (f"the job already has {MAX_KEYS_PER_JOB} metric names, the most one job "
                   "may store")
        else:
            why = ("a metric name is 1-64 characters of letters, digits and _ . : / -, "
                   "starting with a letter or _")
        s.add(m.Event(job_id=job_id, at=datetime.now(UTC), kind=JobEventKind.WARNING, src=None,
                      dst=None,
                      reason=Reason.METRICS_DROPPED.value,
                      message=f"metrics not stored: {shown}{more} ({why}); later ones "
                              "of this kind are dropped without another event",
                      data={"cause": cause, "keys": [n[:MAX_KEY_CHARS]
                                                     for n in names[:_EVENT_NAMES]]}))


@dataclass(frozen=True)
class Series:
    """One key of one rank, bucketed: parallel lists, one entry per non-empty bucket."""

    key: str
    rank: int
    step: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    min: list[float] = field(default_factory=list)
    max: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SeriesPage:
    from_step: int | None  # the first and last step in range (None: no rows)
    to_step: int | None
    bucket_steps: int  # steps per bucket (1: every row)
    rows: int  # metric rows in range (every rank asked for)
    series: list[Series]


def _sig(v: float | None) -> float:
    """Six significant digits: a chart needs no more, and the payload halves."""
    return float(f"{float(v or 0.0):.6g}")


class MetricValueOps(StoreBase):
    def list_metric_keys(self, job_id: str) -> list[str]:
        """The job's stored extra metric names, in the order they were first reported (by
        name within one batch)."""
        stmt = (select(m.MetricKey.key).where(m.MetricKey.job_id == job_id)
                .order_by(m.MetricKey.created_at, m.MetricKey.key))
        with self._tx() as s:
            return list(s.scalars(stmt))

    def list_extra_values(self, job_id: str, *, rank: int | None, first_step: int,
                          last_step: int, keys: Sequence[str] | None
                          ) -> dict[tuple[int, int, int], dict[str, float]]:
        """(attempt, rank, step) -> {key: value} for the steps in [first_step, last_step]."""
        stmt = select(m.MetricValue.attempt, m.MetricValue.rank, m.MetricValue.step,
                      m.MetricValue.key, m.MetricValue.value).where(
            m.MetricValue.job_id == job_id, m.MetricValue.step >= first_step,
            m.MetricValue.step <= last_step)
        if rank is not None:
            stmt = stmt.where(m.MetricValue.rank == rank)
        if keys is not None:
            stmt = stmt.where(m.MetricValue.key.in_(list(keys)))
        out: dict[tuple[int, int, int], dict[str, float]] = {}
        with self._tx() as s:
            for a, r, st, k, v in s.execute(stmt):
                out.setdefault((a, r, st), {})[k] = v
        return out

    def metric_series(self, job_id: str, *, keys: Sequence[str], ranks: Sequence[int],
                      points: int, from_step: int | None = None,
                      to_step: int | None = None) -> SeriesPage:
        """`keys` (fixed columns or extra names) of `ranks`, in at most `points` buckets over
        the steps in [from_step, to_step] (see the module doc)."""
        ranks = sorted(set(ranks))
        with self._tx() as s:
            where = [m.Metric.job_id == job_id, m.Metric.rank.in_(ranks)]
            if from_step is not None:
                where.append(m.Metric.step >= from_step)
            if to_step is not None:
                where.append(m.Metric.step <= to_step)
            lo, hi, rows = s.execute(select(func.min(m.Metric.step), func.max(m.Metric.step),
                                            func.count()).where(*where)).one()
            if lo is None:
                return SeriesPage(from_step=None, to_step=None, bucket_steps=1, rows=0,
                                  series=[])
            width = max(1, -(-(hi - lo + 1) // max(1, points)))
            found: dict[tuple[str, int], Series] = {}
            fixed = [k for k in keys if k in FIXED_FIELDS]
            extra = [k for k in keys if k not in FIXED_FIELDS]
            if fixed:
                self._fixed_buckets(s, where, fixed, lo=lo, width=width, into=found)
            if extra:
                self._extra_buckets(s, job_id, extra, ranks=ranks, lo=lo, hi=hi, width=width,
                                    into=found)
        order = {k: i for i, k in enumerate(keys)}
        series = sorted(found.values(), key=lambda x: (order[x.key], x.rank))
        return SeriesPage(from_step=lo, to_step=hi, bucket_steps=width, rows=rows,
                          series=series)

    @staticmethod
    def _fixed_buckets(s: Any, where: list[Any], keys: list[str], *, lo: int, width: int,
                       into: dict[tuple[str, int], Series]) -> None:
        bucket = ((m.Metric.step - lo) // width).label("b")
        cols: list[Any] = [m.Metric.rank, bucket, func.min(m.Metric.step),
                           func.min(m.Metric.time)]
        for k in keys:
            c = getattr(m.Metric, k)
            cols += [func.avg(c), func.min(c), func.max(c), func.count(c)]
        stmt = select(*cols).where(*where).group_by(m.Metric.rank, bucket).order_by(
            m.Metric.rank, bucket)
        for row in s.execute(stmt):
            rank, _, step, t = row[:4]
            for i, k in enumerate(keys):
                mean, mn, mx, n = row[4 + 4 * i: 8 + 4 * i]
                if n:
                    _append(into, k, rank, step, t, mean, mn, mx, n)

    @staticmethod
    def _extra_buckets(s: Any, job_id: str, keys: list[str], *, ranks: list[int], lo: int,
                       hi: int, width: int, into: dict[tuple[str, int], Series]) -> None:
        v = m.MetricValue
        bucket = ((v.step - lo) // width).label("b")
        stmt = (select(v.key, v.rank, bucket, func.min(v.step), func.min(v.time),
                       func.avg(v.value), func.min(v.value), func.max(v.value), func.count())
                .where(v.job_id == job_id, v.key.in_(keys), v.rank.in_(ranks),
                       v.step >= lo, v.step <= hi)
                .group_by(v.key, v.rank, bucket).order_by(v.key, v.rank, bucket))
        for key, rank, _, step, t, mean, mn, mx, n in s.execute(stmt):
            _append(into, key, rank, step, t, mean, mn, mx, n)


def _append(into: dict[tuple[str, int], Series], key: str, rank: int, step: int, t: float,
            mean: float, mn: float, mx: float, n: int) -> None:
    x = into.get((key, rank))
    if x is None:
        x = into[(key, rank)] = Series(key=key, rank=rank)
    x.step.append(int(step))
    x.time.append(round(float(t), 2))
    x.mean.append(_sig(mean))
    x.min.append(_sig(mn))
    x.max.append(_sig(mx))
    x.count.append(int(n))
