"""Per-user quota rows (limits an admin set) and the counts the checks need."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

from sqlalchemy import select

from orchestrator.admission.quotas import QUOTA_NAMES, Quota
from orchestrator.store import models as m
from orchestrator.store.base import StoreBase


def _quota(row: m.UserQuota | None) -> Quota | None:
    if row is None:
        return None
    return Quota(**{name: getattr(row, name) for name in QUOTA_NAMES})


class QuotaOps(StoreBase):
    def get_quota(self, user_name: str) -> Quota | None:
        """The limits set for the user (unset fields None), or None without a row."""
        with self._tx() as s:
            row = s.scalar(select(m.UserQuota).join(m.User, m.User.id == m.UserQuota.user_id)
                           .where(m.User.name == user_name))
            return _quota(row)

    def set_quota(self, user_name: str, quota: Quota) -> Quota:
        """Replaces the user's limits (None fields fall back to the server's defaults)."""
        with self._tx() as s:
            user = s.scalar(select(m.User).where(m.User.name == user_name))
            if user is None:
                raise LookupError(f"no user named {user_name!r}")
            row = s.get(m.UserQuota, user.id)
            if row is None:
                row = m.UserQuota(user_id=user.id)
                s.add(row)
            for name, value in asdict(quota).items():
                setattr(row, name, value)
            row.updated_at = datetime.now(UTC)
            s.flush()
            return _quota(row) or Quota()
