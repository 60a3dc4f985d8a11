"""Bearer-token authentication. Tokens are hashed at rest by the store; this module only
extracts the token from the request and asks the store who it belongs to."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from api.errors import Unauthorized
from orchestrator.store.records import UserRecord
from orchestrator.store.repo import Store


def bearer_token(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def authenticate(conn: HTTPConnection, store: Store) -> UserRecord:
    """Returns the caller or raises 401 (with WWW-Authenticate: Bearer)."""
    token = bearer_token(conn)
    if token is None:
        raise Unauthorized("missing bearer token; send `Authorization: Bearer <token>` "
                           "(see `meshyard token create`)")
    user = store.authenticate(token)
    if user is None:
        raise Unauthorized("invalid bearer token")
    return user
