"""Pure ASGI middleware: the request-body limit, HTTP request metrics, the Host check.

Pure ASGI (not BaseHTTPMiddleware) so a streamed body is counted chunk by chunk as the app
reads it: a chunked upload without Content-Length is cut off at the limit, not buffered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import PROBLEM_JSON, BodyTooLarge, problem
from api.metrics import HttpMetrics


class BodyLimitMiddleware:
    """`overrides`: a larger limit for an exact path (code package uploads stream to disk)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int,
                 overrides: dict[str, int] | None = None) -> None:
        self.app = app
        self.limit = max_body_bytes
        self.overrides = dict(overrides or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.overrides.get(scope.get("path", ""), self.limit)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._reject(scope, receive, send, limit)
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            # Normally the app's error handlers answer; this covers a read outside a route.
            if started:
                raise
            await self._reject(scope, receive, send, limit)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        response = problem(status=413, detail=str(BodyTooLarge(limit).detail),
                           instance=scope.get("path", ""),
                           problem_type=BodyTooLarge.problem_type,
                           headers={"Connection": "close"})
        assert response.media_type == PROBLEM_JSON
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class MetricsMiddleware:
    """Counts requests and observes latency by method, route template and status."""

    def __init__(self, app: ASGIApp, *, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.metrics.observe(method=scope["method"], route=_route_template(scope),
                                 status=status, seconds=time.perf_counter() - start)


def _route_template(scope: Scope) -> str:
    # The router stores the matched route in the scope; its template ("/v1/jobs/{job_id}")
    # keeps label cardinality bounded, unlike the raw path.
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "<unmatched>"


PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class HostCheckMiddleware:
    """Answers only requests whose Host header is one this server is known by.

    A page on an attacker's domain that re-resolves that domain to 127.0.0.1 (DNS rebinding)
    reaches a loopback server with the attacker's name in Host; refusing unknown names keeps
    such a page from reading the API or the dashboard. Loopback names always pass; probes and
    metrics (which name no job or user) pass whatever the Host, for kubelet and scrapers.
    """

    def __init__(self, app: ASGIApp, *, allowed: Callable[[str], bool]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        host = _host_name(scope)
        if host is not None and self.allowed(host):
            await self.app(scope, receive, send)
            return
        response = problem(status=400, instance=scope.get("path", ""),
                           problem_type="urn:meshyard:problem:host-not-allowed",
                           detail=f"this server does not answer for host {host!r}; an operator "
                           "adds the name it is reached by to MESHYARD_ALLOWED_HOSTS",
                           extensions={"setting": "MESHYARD_ALLOWED_HOSTS"})
        await response(scope, receive, send)


def _host_name(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"host":
            text = value.decode("latin-1").strip()
            if text.startswith("["):  # [::1]:8470
                return text[1:text.find("]")] if "]" in text else None
            return text.rsplit(":", 1)[0] if text.count(":") == 1 else text
    return None
