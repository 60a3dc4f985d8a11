"""Authentication: a bearer API token, or the dashboard's session cookie. Tokens and session
secrets are hashed at rest by the store; this module extracts the credential and asks the
store who it belongs to, remembering the answer for a few seconds.

The cache saves a database round trip and a threadpool hop on every authenticated request
(the largest fixed cost of a read). Only successes are cached, so a new token works at once;
a token revoked through this server, or a session logged out here, is forgotten at once; one
revoked elsewhere (another replica, the offline CLI) stops working within `ttl_s`.

A bearer token the store does not know counts as a failed login of the client's address
(api/throttle.py); an address over the limit gets 429 for any token not already known good.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from api.dashboard.session import cookie_session, csrf_problem
from api.errors import Forbidden, LoginThrottled, Unauthorized
from api.throttle import FailedLogins, client_address
from orchestrator.store.records import UserRecord
from orchestrator.store.repo import Store
from orchestrator.store.users import hash_token

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
    """credential digest -> (expiry, user, token digest); LRU-bounded. Used from the event
    loop only.

    A token's key is its SHA-256 hex digest, which is also what the store keeps, so a token
    revoked by id can be forgotten here (`forget_digest`) without knowing the token; a session
    is kept with the digest of the token that opened it, so the same call forgets the
    sessions that token opened."""

    def __init__(self, *, ttl_s: float = 5.0, max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self._clock = ttl_s, max_entries, clock
        self._entries: OrderedDict[str, tuple[float, UserRecord, str]] = OrderedDict()

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def get(self, token: str) -> UserRecord | None:
        key = self._key(token)
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] < self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return hit[1]

    def put(self, token: str, user: UserRecord, *, opened_by: str | None = None) -> None:
        """`opened_by`: for a session, the digest of the token that opened it."""
        key = self._key(token)
        self._entries[key] = (self._clock() + self.ttl_s, user, opened_by or key)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget(self, token: str) -> None:
        self._entries.pop(self._key(token), None)

    def forget_digest(self, digest: str) -> None:
        """Forgets the token with this digest and every session it opened."""
        for key in [k for k, hit in self._entries.items() if hit[2] == digest]:
            del self._entries[key]


def lookup(store: Store, cred: Credential) -> UserRecord | None:
    """The store's answer, uncached (streams re-check with this)."""
    found = lookup_token(store, cred)
    return found[0] if found else None


def lookup_token(store: Store, cred: Credential) -> tuple[UserRecord, str] | None:
    """The store's answer with the digest of the API token behind the credential."""
    if len(cred.secret) > MAX_TOKEN_CHARS:
        return None
    if cred.session:
        return store.session_user_token(cred.secret)
    user = store.authenticate(cred.secret)
    return (user, hash_token(cred.secret)) if user is not None else None


async def authenticate(conn: HTTPConnection, store: Store, cache: TokenCache,
                       throttle: FailedLogins) -> UserRecord:
    """Returns the caller or raises 401 (with WWW-Authenticate: Bearer), or 429 while the
    client's address is over its failed logins.

    The web dashboard's session cookie is accepted too (keep this: the dashboard's fetches
    rely on it); a state change made with the cookie must pass the CSRF check in
    api/dashboard/session.py, else 403. An expired session is not a failed login: a
    dashboard left open polls with it until the user logs in again."""
    cred = credential(conn)
    if cred is None:
        raise Unauthorized("missing bearer token; send `Authorization: Bearer <token>` "
                           "(see `meshyard token create`)")
    user = cache.get(cred.cache_key)
    if user is None:
        client = client_address(conn)
        if not cred.session and (wait := throttle.retry_after(client)) is not None:
            raise LoginThrottled(wait)
        found = await run_in_threadpool(lookup_token, store, cred)
        if found is None:
            if not cred.session:
                throttle.failed(client)
            raise Unauthorized("invalid or expired session; log in again" if cred.session
                               else "invalid bearer token")
        user, token_digest = found
        cache.put(cred.cache_key, user, opened_by=token_digest)
    if cred.session and (problem := csrf_problem(conn, cred.secret)) is not None:
        raise Forbidden(problem)
    return user
