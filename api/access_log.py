"""The access log never holds a credential: query parameters named like one (`token`,
`access_token`, `api_key`, `secret`, `password`, `session`, ...) and values that are meshyard
tokens or session secrets are written as `***`.

The server reads tokens only from the Authorization header and the session cookie, but a
client may still put one in a URL (`?token=...`, pasted from elsewhere); uvicorn writes each
request's path and query string to its access log (`uvicorn.access`), which operators ship to
log stores that many people read.

    >>> redact_query("/v1/jobs?limit=5&token=msy_abc&q=x")
    '/v1/jobs?limit=5&token=***&q=x'
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

from orchestrator.store.sessions import SESSION_PREFIX
from orchestrator.store.users import TOKEN_PREFIX

SECRET_NAME = re.compile(r"token|secret|passw|api[-_]?key|auth|session|credential|signature",
                         re.IGNORECASE)
REDACTED = "***"


def redact_query(target: str) -> str:
    """`target` (a path with its query string) with credential-like parameters redacted."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    out = []
    for item in query.split("&"):
        name, _, value = item.partition("=")
        secret = SECRET_NAME.search(unquote_plus(name)) or \
            unquote_plus(value).strip().startswith((TOKEN_PREFIX, SESSION_PREFIX))
        out.append(f"{name}={REDACTED}" if secret else item)
    return f"{path}?{'&'.join(out)}"


class RedactQuerySecrets(logging.Filter):
    """On `uvicorn.access`, whose records carry (client, method, path?query, version,
    status) as their arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) \
                and "?" in args[2]:
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


_FILTER = RedactQuerySecrets()


def redact_access_log() -> None:
    """Installs the filter on uvicorn's access logger (once, however often called)."""
    logging.getLogger("uvicorn.access").addFilter(_FILTER)
