"""The node health ledger's rows (orchestrator/nodes/health_policy.py decides; this only keeps).

`update_node_health(name, fn)` reads, applies `fn` and writes in one transaction, so the poller
(evidence) and an admin (cordon / uncordon) never overwrite each other's change.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import select

from orchestrator.nodes.health_policy import Evidence, NodeHealth, NodeState
from orchestrator.store import models as m
from orchestrator.store.base import StoreBase


def _dt(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def _ts(d: datetime | None) -> float | None:
    return None if d is None else d.timestamp()


def _health(row: m.NodeHealthRow) -> NodeHealth:
    items = (row.evidence or {}).get("items") or []
    return NodeHealth(node=row.name, state=NodeState(row.state), reason=row.reason or "",
                      since=_ts(row.since), until=_ts(row.until), permanent=row.permanent,
                      gpus={int(k): v for k, v in (row.gpus or {}).items()},
                      evidence=tuple(Evidence.from_dict(e) for e in items),
                      cleared_at=_ts(row.cleared_at))


class HealthOps(StoreBase):
    def list_node_health(self) -> list[NodeHealth]:
        with self._tx() as s:
            return [_health(x) for x in s.scalars(select(m.NodeHealthRow)
                                                  .order_by(m.NodeHealthRow.name))]

    def get_node_health(self, name: str) -> NodeHealth | None:
        with self._tx() as s:
            row = s.get(m.NodeHealthRow, name)
            return None if row is None else _health(row)

    def update_node_health(self, name: str,
                           fn: Callable[[NodeHealth | None], NodeHealth], *,
                           node_id: str | None = None) -> NodeHealth:
        """Applies `fn` to the node's entry (None: no entry yet) and stores the result."""
        with self._tx() as s:
            row = s.get(m.NodeHealthRow, name, with_for_update=True)
            new = fn(None if row is None else _health(row))
            if row is None:
                row = m.NodeHealthRow(name=name)
                s.add(row)
            row.node_id = node_id or row.node_id
            row.state, row.reason = new.state.value, new.reason[:2000]
            row.since, row.until = _dt(new.since), _dt(new.until)
            row.permanent, row.cleared_at = new.permanent, _dt(new.cleared_at)
            row.gpus = {str(k): v for k, v in new.gpus.items()}
            row.evidence = {"items": [e.to_dict() for e in new.evidence]}
            row.updated_at = datetime.now(UTC)
            s.flush()
            return _health(row)
