"""Users, their roles and API tokens. Tokens are random 32-byte strings stored as SHA-256
hex digests; the plaintext is returned once, when the token is made."""

from __future__ import annotations

import hashlib
import re
import secrets

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.admission.access import Role
from orchestrator.store import models as m
from orchestrator.store.base import StoreBase, user_record
from orchestrator.store.records import TokenRecord, UserRecord

ADMIN_NAME = "admin"
TOKEN_PREFIX = "msy_"
USER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$")
MAX_LABEL = 200


def hash_token(token: str) -> str:
    # Tokens carry 256 bits of entropy, so a plain digest (no salt, no KDF) is safe and lets
    # authentication be one indexed lookup.
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def check_user_name(name: str) -> str:
    if not USER_NAME_RE.match(name):
        raise ValueError(f"user name {name[:40]!r} must be 1-128 characters of letters, digits "
                         "and . _ @ + -, starting with a letter or digit")
    return name


def check_label(label: str) -> str:
    if len(label) > MAX_LABEL or not label.isprintable():
        raise ValueError(f"a token label is at most {MAX_LABEL} printable characters")
    return label


def _token_record(t: m.ApiToken, user: str) -> TokenRecord:
    return TokenRecord(id=t.id, user=user, label=t.label, created_at=t.created_at,
                       revoked=t.revoked)


class UserOps(StoreBase):
    def _get_or_create_user(self, s: Session, name: str, *, role: Role | None) -> m.User:
        """`role` None keeps an existing user's role (new users get `user`)."""
        user = s.scalar(select(m.User).where(m.User.name == name))
        if user is None:
            user = m.User(name=name, role=(role or Role.USER).value)
            s.add(user)
            s.flush()
        elif role is not None and user.role != role.value:
            self._check_not_last_admin(s, user, role)
            user.role = role.value
        return user

    def _check_not_last_admin(self, s: Session, user: m.User, role: Role) -> None:
        if user.role == Role.ADMIN.value and role != Role.ADMIN:
            admins = s.scalar(select(func.count()).select_from(m.User)
                              .where(m.User.role == Role.ADMIN.value))
            if (admins or 0) <= 1:
                raise ValueError(f"{user.name} is the only admin; make another user admin "
                                 "before changing this one's role")

    def create_user(self, name: str, *, admin: bool = False,
                    role: Role | None = None) -> UserRecord:
        """Creates `name` if missing; with `role` (or admin=True), sets its role."""
        check_user_name(name)
        wanted = Role.ADMIN if admin else role
        for _ in range(3):  # concurrent creators race on the unique name; retry reads it
            try:
                with self._tx() as s:
                    return user_record(self._get_or_create_user(s, name, role=wanted))
            except IntegrityError:
                continue
        raise RuntimeError(f"could not create user {name!r}")

    def set_role(self, name: str, role: Role) -> UserRecord:
        with self._tx() as s:
            user = s.scalar(select(m.User).where(m.User.name == name))
            if user is None:
                raise LookupError(f"no user named {name!r}")
            self._check_not_last_admin(s, user, role)
            user.role = role.value
            return user_record(user)

    def list_users(self) -> list[UserRecord]:
        with self._tx() as s:
            return [user_record(u) for u in s.scalars(select(m.User).order_by(m.User.name))]

    def issue_token(self, user_name: str, *, role: Role | None = None, label: str = "",
                    token: str | None = None) -> tuple[TokenRecord, str]:
        """Creates the user if missing (with `role`, default user; an existing user's role
        changes only when `role` is given) and a token; returns it and its plaintext."""
        self.create_user(user_name, role=role)
        check_label(label)
        plain = token or new_token()
        digest = hash_token(plain)
        with self._tx() as s:
            user = s.scalar(select(m.User).where(m.User.name == user_name))
            assert user is not None
            row = s.scalar(select(m.ApiToken).where(m.ApiToken.token_hash == digest))
            if row is None:
                row = m.ApiToken(user_id=user.id, token_hash=digest, label=label)
                s.add(row)
                s.flush()
            return _token_record(row, user.name), plain

    def create_token(self, user_name: str, *, admin: bool = False, label: str = "",
                     token: str | None = None, role: Role | None = None) -> str:
        """Creates the user if missing and returns a new plaintext token (shown once)."""
        return self.issue_token(user_name, role=Role.ADMIN if admin else role, label=label,
                                token=token)[1]

    def has_admin(self) -> bool:
        with self._tx() as s:
            return s.scalar(select(m.User.id).where(m.User.role == Role.ADMIN.value)
                            .limit(1)) is not None

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
        found = self.authenticate_token(token)
        return found[0] if found else None

    def authenticate_token(self, token: str) -> tuple[UserRecord, int] | None:
        """The user a live token belongs to, and the token's id."""
        if not token:
            return None
        with self._tx() as s:
            row = s.execute(
                select(m.User, m.ApiToken.id).join(m.ApiToken, m.ApiToken.user_id == m.User.id)
                .where(m.ApiToken.token_hash == hash_token(token), m.ApiToken.revoked.is_(False))
            ).one_or_none()
            return (user_record(row[0]), int(row[1])) if row else None

    def list_tokens(self, *, user: str | None = None, include_revoked: bool = False,
                    after: int = 0, limit: int = 500) -> list[TokenRecord]:
        stmt = (select(m.ApiToken, m.User.name).join(m.User, m.User.id == m.ApiToken.user_id)
                .where(m.ApiToken.id > after).order_by(m.ApiToken.id).limit(limit))
        if user is not None:
            stmt = stmt.where(m.User.name == user)
        if not include_revoked:
            stmt = stmt.where(m.ApiToken.revoked.is_(False))
        with self._tx() as s:
            return [_token_record(t, name) for t, name in s.execute(stmt)]

    def revoke_token(self, token_id: int, *, owner: str | None = None
                     ) -> tuple[TokenRecord, str] | None:
        """Revokes one token (only `owner`'s when given) and deletes the dashboard sessions it
        opened. Returns it and its digest, or None when there is no such token (or it is
        someone else's)."""
        with self._tx() as s:
            row = s.execute(select(m.ApiToken, m.User.name)
                            .join(m.User, m.User.id == m.ApiToken.user_id)
                            .where(m.ApiToken.id == token_id)).one_or_none()
            if row is None or (owner is not None and row[1] != owner):
                return None
            token, name = row
            token.revoked = True
            s.execute(delete(m.DashboardSession).where(m.DashboardSession.token_id == token.id))
            return _token_record(token, name), token.token_hash

    def revoke_tokens(self, user_name: str, *, token: str | None = None) -> int:
        """Revokes one token of the user (`token`) or all of them, with the dashboard
        sessions they opened; returns how many tokens."""
        with self._tx() as s:
            user = s.scalar(select(m.User).where(m.User.name == user_name))
            if user is None:
                raise LookupError(f"no user named {user_name!r}")
            which = select(m.ApiToken.id).where(m.ApiToken.user_id == user.id,
                                                m.ApiToken.revoked.is_(False))
            if token is not None:
                which = which.where(m.ApiToken.token_hash == hash_token(token))
            ids = list(s.scalars(which))
            if ids:
                s.execute(update(m.ApiToken).where(m.ApiToken.id.in_(ids)).values(revoked=True))
                s.execute(delete(m.DashboardSession)
                          .where(m.DashboardSession.token_id.in_(ids)))
            return len(ids)

    def get_user(self, name: str) -> UserRecord | None:
        with self._tx() as s:
            u = s.scalar(select(m.User).where(m.User.name == name))
            return user_record(u) if u else None
