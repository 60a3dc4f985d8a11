"""The interactive API docs (/docs, Swagger UI): served only when `api_docs` is on, and then
under a Content-Security-Policy that lets the page run exactly its own two scripts.

Swagger UI's page loads its bundle from a CDN and starts it with one inline script; the CSP
names that script by its SHA-256, so nothing injected into the page (or into the schema it
renders) can run. /openapi.json itself is always served: it is data, not a page.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

CDN = "https://cdn.jsdelivr.net"
_INLINE = re.compile(r"<script>(.*?)</script>", re.S)


def docs_csp(html: str) -> str:
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in _INLINE.findall(html))
    return (f"default-src 'none'; script-src {CDN} {hashes}; style-src {CDN} 'unsafe-inline'; "
            f"img-src 'self' data: {CDN} https://fastapi.tiangolo.com; connect-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def install(app: FastAPI) -> None:
    """Registers /docs. The app is built with docs_url=None, so this is the only docs page."""
    page = get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json",
                               title=f"{app.title} API")
    html = bytes(page.body).decode()
    headers = {"Content-Security-Policy": docs_csp(html), "X-Content-Type-Options": "nosniff",
               "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin"}

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Any:
        return HTMLResponse(html, headers=headers)
