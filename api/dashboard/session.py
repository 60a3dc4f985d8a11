"""The dashboard's browser session: the session cookie and the CSRF check that guards it.

Logging in with an API token opens a server-side session (orchestrator/store/sessions.py); the
HttpOnly, SameSite=Strict cookie holds only that session's random secret, never the API token,
so a stolen cookie is not a token, logout ends it for good (the row is deleted), and it expires
(`session_ttl_s`). The cookie is Secure when the request came over HTTPS (directly, or through
a trusted proxy that says so in X-Forwarded-Proto). Because a browser attaches cookies by
itself, a request authenticated by the cookie (not by an `Authorization` header) that changes
state must also prove it came from our own page:

  * `X-CSRF-Token` must equal `csrf_token(secret)`, an HMAC of the session secret that the
    server prints into each page it renders (a cross-site page cannot read it, and cannot
    compute it without the secret), and
  * an `Origin` header, when the browser sends one, must be this server's own origin.

SameSite=Strict already keeps the cookie off cross-site requests; these checks are the second
line for browsers or proxies that get SameSite wrong.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import HTTPConnection

COOKIE_NAME = "meshyard_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"  # the hidden form field on HTML forms (logout)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_COOKIE_CHARS = 200


def cookie_session(conn: HTTPConnection) -> str | None:
    """The session secret the browser sent, if any (bounded: it is hashed per request)."""
    value = conn.cookies.get(COOKIE_NAME, "").strip()
    return value if value and len(value) <= MAX_COOKIE_CHARS else None


def csrf_token(session_secret: str) -> str:
    """Deterministic per session: `csrf_token(s) == csrf_token(s)`, unguessable without s."""
    return hmac.new(session_secret.encode(), b"meshyard-dashboard-csrf",
                    hashlib.sha256).hexdigest()


def own_origin(conn: HTTPConnection) -> str:
    host = conn.headers.get("host", "")
    return f"{conn.url.scheme}://{host}"


def origin_ok(conn: HTTPConnection) -> bool:
    """True when the request carries no Origin (same-origin GET, non-browser client) or ours."""
    origin = conn.headers.get("origin")
    if origin is None:
        return True
    return origin == own_origin(conn)


def csrf_problem(conn: HTTPConnection, session_secret: str, *,
                 submitted: str | None = None) -> str | None:
    """Why a cookie-authenticated state change is refused, or None when it may proceed.

    `submitted` is the token from a form field; otherwise the `X-CSRF-Token` header is used.
    """
    method = conn.scope.get("method", "GET")
    if method in SAFE_METHODS:
        return None
    if not origin_ok(conn):
        return f"cross-origin request from {conn.headers.get('origin')!r} refused"
    given = submitted if submitted is not None else conn.headers.get(CSRF_HEADER, "")
    if not given or not hmac.compare_digest(given, csrf_token(session_secret)):
        return ("missing or wrong CSRF token; send the page's csrf token in the "
                "X-CSRF-Token header (or use an Authorization: Bearer header)")
    return None
