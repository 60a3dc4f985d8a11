"""Bearer-token authentication. Tokens are hashed at rest by the store; this module only
extracts the token from the request and asks the store who it belongs to."""

from __future__ import annotations

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


def authenticate(conn: HTTPConnection, store: Store) -> UserRecord:
    """Returns the caller or raises 401 (with WWW-Authenticate: Bearer).

    The dashboard's session cookie is accepted too; a state change made with it must pass the
    CSRF check (api/dashboard/session.py), else 403."""
    token = bearer_token(conn)
    from_cookie = token is None
    if token is None:
        token = cookie_token(conn)
    if token is None:
        raise Unauthorized("missing bearer token; send `Authorization: Bearer <token>` "
                           "(see `meshyard token create`)")
    user = store.authenticate(token)
    if user is None:
        raise Unauthorized("invalid bearer token")
    if from_cookie and (problem := csrf_problem(conn, token)) is not None:
        raise Forbidden(problem)
    return user
