"""Pure ASGI middleware: the request-body limit and HTTP request metrics.

Pure ASGI (not BaseHTTPMiddleware) so a streamed body is counted chunk by chunk as the app
reads it: a chunked upload without Content-Length is cut off at the limit, not buffered.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import PROBLEM_JSON, BodyTooLarge, problem
from api.metrics import HttpMetrics


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._reject(scope, receive, send)
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
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
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(status=413, detail=str(BodyTooLarge(self.limit).detail),
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
