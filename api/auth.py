"""Bearer-token authentication. Tokens are hashed at rest by the store; this module extracts
the token and asks the store who it belongs to, remembering the answer for a few seconds.

The cache saves a database round trip and a threadpool hop on every authenticated request
(the largest fixed cost of a read). Only successes are cached, so a new token works at once;
a revoked one stops working within `ttl_s`.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from api.dashboard.session import cookie_token, csrf_problem
from api.errors import Forbidden, Unauthorized
from orchestrator.store.records import UserRecord
from orchestrator.store.repo import Store


def bearer_token(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


class TokenCache:
    """token digest -> (expiry, user); LRU-bounded. Used from the event loop only."""

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


async def authenticate(conn: HTTPConnection, store: Store, cache: TokenCache) -> UserRecord:
    """Returns the caller or raises 401 (with WWW-Authenticate: Bearer).

    The web dashboard's session cookie is accepted too (keep this: the dashboard's fetches
    rely on it); a state change made with the cookie must pass the CSRF check in
    api/dashboard/session.py, else 403."""
    token = bearer_token(conn)
    from_cookie = token is None
    if token is None:
        token = cookie_token(conn)
    if token is None:
        raise Unauthorized("missing bearer token; send `Authorization: Bearer <token>` "
                           "(see `meshyard token create`)")
    user = cache.get(token)
    if user is None:
        user = await run_in_threadpool(store.authenticate, token)
        if user is None:
            raise Unauthorized("invalid bearer token")
        cache.put(token, user)
    if from_cookie and (problem := csrf_problem(conn, token)) is not None:
        raise Forbidden(problem)
    return user
