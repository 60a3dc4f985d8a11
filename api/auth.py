"""Authentication: a bearer API token, or the dashboard's session cookie. Tokens and session
secrets are hashed at rest by the store; this module extracts the credential and asks the
store who it belongs to, remembering the answer for a few seconds.

The cache saves a database round trip and a threadpool hop on every authenticated request
(the largest fixed cost of a read). Only successes are cached, so a new token works at once;
a token revoked through this server, or a session logged out here, is forgotten at once; one
revoked elsewhere (another replica, the offline CLI) stops working within `ttl_s`.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from api.dashboard.session import cookie_session, csrf_problem
from api.errors import Forbidden, Unauthorized
from orchestrator.store.records import UserRecord
from orchestrator.store.repo import Store

MAX_TOKEN_CHARS = 200  # ours are 47; anything longer is not one (and is hashed per request)
SESSION_KEY = "session:"


def bearer_token(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


@dataclass(frozen=True)
class Credential:
    """What a request authenticated with: an API token, or a dashboard session secret."""

    secret: str
    session: bool

    @property
    def cache_key(self) -> str:
        return SESSION_KEY + self.secret if self.session else self.secret


def credential(conn: HTTPConnection) -> Credential | None:
    token = bearer_token(conn)
    if token is not None:
        return Credential(token, session=False)
    secret = cookie_session(conn)
    return Credential(secret, session=True) if secret is not None else None


class TokenCache:
    """credential digest -> (expiry, user); LRU-bounded. Used from the event loop only.

    A token's key is its SHA-256 hex digest, which is also what the store keeps, so a token
    revoked by id can be forgotten here (`forget_digest`) without knowing the token."""

    def __init__(self, *, ttl_s: float = 5.0, max_entries: int = 1024) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._entries: OrderedDict[str, tuple[float, UserRecord]] = OrderedDict()

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def get(self, token: str) -> UserRecord | None:
        key = self._key(token)
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return hit[1]

    def put(self, token: str, user: UserRecord) -> None:
        self._entries[self._key(token)] = (time.monotonic() + self.ttl_s, user)
        self._entries.move_to_end(self._key(token))
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget(self, token: str) -> None:
        self.forget_digest(self._key(token))

    def forget_digest(self, digest: str) -> None:
        self._entries.pop(digest, None)


def lookup(store: Store, cred: Credential) -> UserRecord | None:
    """The store's answer, uncached (streams re-check with this)."""
    if len(cred.secret) > MAX_TOKEN_CHARS:
        return None
    return store.session_user(cred.secret) if cred.session else store.authenticate(cred.secret)


async def authenticate(conn: HTTPConnection, store: Store, cache: TokenCache) -> UserRecord:
    """Returns the caller or raises 401 (with WWW-Authenticate: Bearer).

    The web dashboard's session cookie is accepted too (keep this: the dashboard's fetches
    rely on it); a state change made with the cookie must pass the CSRF check in
    api/dashboard/session.py, else 403."""
    cred = credential(conn)
    if cred is None:
        raise Unauthorized("missing bearer token; send `Authorization: Bearer <token>` "
                           "(see `meshyard token create`)")
    user = cache.get(cred.cache_key)
    if user is None:
        user = await run_in_threadpool(lookup, store, cred)
        if user is None:
            raise Unauthorized("invalid or expired session; log in again" if cred.session
                               else "invalid bearer token")
        cache.put(cred.cache_key, user)
    if cred.session and (problem := csrf_problem(conn, cred.secret)) is not None:
        raise Forbidden(problem)
    return user
