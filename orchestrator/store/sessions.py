"""Dashboard sessions: a random secret in the browser's cookie, its digest here.

A session belongs to the token it was opened with: revoking that token deletes its sessions
(and a session whose token is revoked by any other way is dead too), and so does logout (the
row is deleted) or its expiry.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select

from orchestrator.store import models as m
from orchestrator.store.base import user_record
from orchestrator.store.records import UserRecord
from orchestrator.store.users import UserOps, hash_token

SESSION_PREFIX = "mss_"


class SessionOps(UserOps):
    def open_session(self, token: str, *, ttl_s: float) -> tuple[str, UserRecord] | None:
        """For a live API token: a new session secret (for the cookie) and its user."""
        found = self.authenticate_token(token)
        if found is None:
            return None
        user, token_id = found
        secret = SESSION_PREFIX + secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        with self._tx() as s:
            s.execute(delete(m.DashboardSession).where(m.DashboardSession.expires_at < now))
            s.add(m.DashboardSession(secret_hash=hash_token(secret), user_id=user.id,
                                     token_id=token_id, created_at=now,
                                     expires_at=now + timedelta(seconds=ttl_s)))
        return secret, user

    def session_user(self, secret: str) -> UserRecord | None:
        """The user of a live session: not expired, not logged out, its token not revoked."""
        found = self.session_user_token(secret)
        return found[0] if found else None

    def session_user_token(self, secret: str) -> tuple[UserRecord, str] | None:
        """A live session's user and the digest of the token that opened it (a cache of
        sessions forgets them when that token is revoked)."""
        if not secret:
            return None
        with self._tx() as s:
            row = s.execute(
                select(m.User, m.ApiToken.token_hash)
                .join(m.DashboardSession, m.DashboardSession.user_id == m.User.id)
                .join(m.ApiToken, m.ApiToken.id == m.DashboardSession.token_id)
                .where(m.DashboardSession.secret_hash == hash_token(secret),
                       m.DashboardSession.expires_at > datetime.now(UTC),
                       m.ApiToken.revoked.is_(False))).one_or_none()
            return (user_record(row[0]), str(row[1])) if row else None

    def close_session(self, secret: str) -> bool:
        with self._tx() as s:
            gone = s.execute(delete(m.DashboardSession)
                             .where(m.DashboardSession.secret_hash == hash_token(secret)))
            return bool(gone.rowcount)  # type: ignore[attr-defined]
