"""Users and API tokens. Tokens are random 32-byte strings stored as SHA-256 hex digests."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.store import models as m
from orchestrator.store.base import StoreBase, user_record
from orchestrator.store.records import UserRecord

ADMIN_NAME = "admin"
TOKEN_PREFIX = "msy_"


def hash_token(token: str) -> str:
    # Tokens carry 256 bits of entropy, so a plain digest (no salt, no KDF) is safe and lets
    # authentication be one indexed lookup.
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class UserOps(StoreBase):
    def _get_or_create_user(self, s: Session, name: str, *, admin: bool) -> m.User:
        user = s.scalar(select(m.User).where(m.User.name == name))
        if user is None:
            user = m.User(name=name, is_admin=admin)
            s.add(user)
            s.flush()
        elif admin and not user.is_admin:
            user.is_admin = True
        return user

    def create_user(self, name: str, *, admin: bool = False) -> UserRecord:
        if not name or len(name) > 128:
            raise ValueError("user name must be 1-128 characters")
        for _ in range(3):  # concurrent creators race on the unique name; retry reads it
            try:
                with self._tx() as s:
                    return user_record(self._get_or_create_user(s, name, admin=admin))
            except IntegrityError:
                continue
        raise RuntimeError(f"could not create user {name!r}")

    def create_token(self, user_name: str, *, admin: bool = False, label: str = "",
                     token: str | None = None) -> str:
        """Creates the user if missing and returns a new plaintext token (shown once)."""
        self.create_user(user_name, admin=admin)
        plain = token or new_token()
        with self._tx() as s:
            user = s.scalar(select(m.User).where(m.User.name == user_name))
            assert user is not None
            digest = hash_token(plain)
            existing = s.scalar(select(m.ApiToken).where(m.ApiToken.token_hash == digest))
            if existing is None:
                s.add(m.ApiToken(user_id=user.id, token_hash=digest, label=label))
        return plain

    def has_admin(self) -> bool:
        with self._tx() as s:
            return s.scalar(select(m.User.id).where(m.User.is_admin.is_(True)).limit(1)) is not None

    def ensure_admin(self, seed_token: str | None) -> str | None:
        """With a seed token, makes sure it authenticates as an admin (returns None).
        Without one, creates the first admin when none exists and returns its plaintext token."""
        if seed_token:
            self.create_token(ADMIN_NAME, admin=True, label="seeded", token=seed_token)
            return None
        if self.has_admin():
            return None
        return self.create_token(ADMIN_NAME, admin=True, label="first start")

    def authenticate(self, token: str) -> UserRecord | None:
        if not token:
            return None
        with self._tx() as s:
            row = s.execute(
                select(m.User).join(m.ApiToken, m.ApiToken.user_id == m.User.id)
                .where(m.ApiToken.token_hash == hash_token(token), m.ApiToken.revoked.is_(False))
            ).scalar_one_or_none()
            return user_record(row) if row else None

    def revoke_tokens(self, user_name: str, *, token: str | None = None) -> int:
        """Revokes one token of the user (`token`) or all of them; returns how many."""
        from sqlalchemy import update

        with self._tx() as s:
            user = s.scalar(select(m.User).where(m.User.name == user_name))
            if user is None:
                raise LookupError(f"no user named {user_name!r}")
            stmt = update(m.ApiToken).where(m.ApiToken.user_id == user.id,
                                            m.ApiToken.revoked.is_(False))
            if token is not None:
                stmt = stmt.where(m.ApiToken.token_hash == hash_token(token))
            return int(s.execute(stmt.values(revoked=True)).rowcount or 0)

    def get_user(self, name: str) -> UserRecord | None:
        with self._tx() as s:
            u = s.scalar(select(m.User).where(m.User.name == name))
            return user_record(u) if u else None
