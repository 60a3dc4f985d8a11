"""The body-limit middleware on a bare ASGI app: declared and streamed sizes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from api.middleware import BodyLimitMiddleware

LIMIT = 100


async def echo_length(scope: dict, receive: Any, send: Any) -> None:
    total = 0
    while True:
        message = await receive()
        total += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(total).encode()})


def call(chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, int]:
    """Runs one request; returns (status, body, chunks the app pulled)."""
    app = BodyLimitMiddleware(echo_length, max_body_bytes=LIMIT)
    pulled = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal pulled
        pulled += 1
        i = pulled - 1
        return {"type": "http.request", "body": chunks[i], "more_body": i + 1 < len(chunks)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/jobs", "headers": headers}
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body, pulled


def test_small_body_passes_through() -> None:
    assert call([b"x" * 60, b"y" * 40], [])[:2] == (200, b"100")


def test_declared_length_over_limit_is_rejected_before_reading() -> None:
    status, body, pulled = call([b"x" * 10], [(b"content-length", b"101")])
    assert (status, pulled) == (413, 0)
    problem = json.loads(body)
    assert problem["status"] == 413 and problem["instance"] == "/v1/jobs"


def test_streamed_body_is_cut_at_the_limit() -> None:
    chunks = [b"x" * 60] * 10  # no Content-Length, 600 bytes
    status, body, pulled = call(chunks, [])
    assert status == 413 and pulled == 2  # stopped at the chunk that crossed the limit
    assert json.loads(body)["type"] == "urn:meshyard:problem:body-too-large"
