"""Utilisation samples (per rank and per node) and a job's checkpoints.

Written only by the control plane: rank samples by the poller (what the controller drained from
the workers, at most one per rank per sampling interval), node samples by the runtime's node
sampler; checkpoints by the poller when rank 0 reports one complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, insert, select, update

from orchestrator.store import models as m
from orchestrator.store import records as r
from orchestrator.store.base import StoreBase

MAX_USAGE_ROWS = 20_000
_RANK_FIELDS = ("cpu_percent", "rss_bytes", "gpu_util", "gpu_mem_bytes", "gpu_mem_total_bytes")
_NODE_FIELDS = ("cpu_percent", "mem_used_bytes", "mem_total_bytes")


def _num(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _rank_usage(x: m.RankUsage) -> r.RankUsageRecord:
    return r.RankUsageRecord(job_id=x.job_id, attempt=x.attempt, rank=x.rank, node=x.node,
                             at=x.at, cpu_percent=x.cpu_percent, rss_bytes=x.rss_bytes,
                             gpu_util=x.gpu_util, gpu_mem_bytes=x.gpu_mem_bytes,
                             gpu_mem_total_bytes=x.gpu_mem_total_bytes)


def _node_usage(x: m.NodeUsage) -> r.NodeUsageRecord:
    return r.NodeUsageRecord(node=x.node, at=x.at, cpu_percent=x.cpu_percent,
                             mem_used_bytes=x.mem_used_bytes, mem_total_bytes=x.mem_total_bytes,
                             gpus=list((x.gpus or {}).get("gpus") or []))


def _checkpoint(x: m.Checkpoint) -> r.CheckpointRecord:
    return r.CheckpointRecord(job_id=x.job_id, attempt=x.attempt, step=x.step, at=x.at,
                              size_bytes=x.size_bytes, path=x.path, removed=x.removed)


class UsageOps(StoreBase):
    # -- ranks ----------------------------------------------------------------------------
    def add_rank_usage(self, job_id: str, attempt: int, rows: Iterable[Mapping[str, Any]], *,
                       cursor: int | None = None) -> None:
        values = [{"job_id": job_id, "attempt": attempt, "rank": int(x["rank"]),
                   "node": x.get("node"), "at": float(x["at"]),
                   **{k: _num(x.get(k)) for k in _RANK_FIELDS}} for x in rows]
        if not values:
            return
        with self._tx() as s:
            s.execute(insert(m.RankUsage), values)
            self._advance_cursor(s, job_id, attempt, cursor)

    def list_rank_usage(self, job_id: str, *, attempt: int | None = None,
                        rank: int | None = None, since: float | None = None,
                        limit: int = 5000) -> list[r.RankUsageRecord]:
        """Oldest first from `since` (unix seconds); the newest `limit` when more match."""
        stmt = select(m.RankUsage).where(m.RankUsage.job_id == job_id)
        if attempt is not None:
            stmt = stmt.where(m.RankUsage.attempt == attempt)
        if rank is not None:
            stmt = stmt.where(m.RankUsage.rank == rank)
        if since is not None:
            stmt = stmt.where(m.RankUsage.at > since)
        stmt = stmt.order_by(m.RankUsage.at.desc(), m.RankUsage.id.desc()).limit(
            max(1, min(limit, MAX_USAGE_ROWS)))
        with self._tx() as s:
            return [_rank_usage(x) for x in reversed(list(s.scalars(stmt)))]

    # -- nodes ----------------------------------------------------------------------------
    def add_node_usage(self, rows: Iterable[Mapping[str, Any]]) -> None:
        values = [{"node": str(x["node"]), "at": float(x["at"]),
                   "gpus": {"gpus": list(x.get("gpus") or [])},
                   **{k: _num(x.get(k)) for k in _NODE_FIELDS}} for x in rows]
        if values:
            with self._tx() as s:
                s.execute(insert(m.NodeUsage), values)

    def list_node_usage(self, *, since: float | None = None, node: str | None = None,
                        limit: int = 5000) -> list[r.NodeUsageRecord]:
        stmt = select(m.NodeUsage)
        if since is not None:
            stmt = stmt.where(m.NodeUsage.at > since)
        if node is not None:
            stmt = stmt.where(m.NodeUsage.node == node)
        stmt = stmt.order_by(m.NodeUsage.at.desc(), m.NodeUsage.id.desc()).limit(
            max(1, min(limit, MAX_USAGE_ROWS)))
        with self._tx() as s:
            return [_node_usage(x) for x in reversed(list(s.scalars(stmt)))]

    def prune_node_usage(self, *, before: float) -> None:
        """Node samples are kept for a window (the runtime prunes older ones)."""
        with self._tx() as s:
            s.execute(delete(m.NodeUsage).where(m.NodeUsage.at < before))

    # -- checkpoints ------------------------------------------------------------------------
    def add_checkpoint(self, job_id: str, attempt: int, info: Mapping[str, Any], *,
                       cursor: int | None = None) -> None:
        """Records one complete checkpoint (rank 0's report). `info["kept"]`, the steps still
        on disk after pruning, marks the others removed."""
        step = int(info["step"])
        at = datetime.fromtimestamp(float(info.get("time") or 0), UTC) \
            if info.get("time") else datetime.now(UTC)
        with self._tx() as s:
            row = s.scalar(select(m.Checkpoint).where(
                m.Checkpoint.job_id == job_id, m.Checkpoint.attempt == attempt,
                m.Checkpoint.step == step))
            if row is None:
                row = m.Checkpoint(job_id=job_id, attempt=attempt, step=step)
                s.add(row)
            row.at, row.path, row.removed = at, str(info.get("path") or ""), False
            row.size_bytes = int(info["size_bytes"]) if _num(info.get("size_bytes")) else None
            kept = info.get("kept")
            if isinstance(kept, list):
                s.execute(update(m.Checkpoint)
                          .where(m.Checkpoint.job_id == job_id,
                                 m.Checkpoint.step.not_in([int(k) for k in kept]))
                          .values(removed=True))
            self._advance_cursor(s, job_id, attempt, cursor)

    def list_checkpoints(self, job_id: str) -> list[r.CheckpointRecord]:
        stmt = (select(m.Checkpoint).where(m.Checkpoint.job_id == job_id)
                .order_by(m.Checkpoint.attempt, m.Checkpoint.step))
        with self._tx() as s:
            return [_checkpoint(x) for x in s.scalars(stmt)]
