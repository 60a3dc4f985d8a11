"""The access log's query strings: credentials out, everything else as it was."""

from __future__ import annotations

import logging

import pytest

from api.access_log import RedactQuerySecrets, redact_query


@pytest.mark.parametrize(("target", "logged"), [
    ("/v1/jobs", "/v1/jobs"),
    ("/v1/jobs?limit=5&state=RUNNING", "/v1/jobs?limit=5&state=RUNNING"),
    ("/v1/jobs?token=msy_abc", "/v1/jobs?token=***"),
    ("/x?access_token=a&API-KEY=b&Secret=c&password=d&x-auth=e", "/x?access_token=***&"
     "API-KEY=***&Secret=***&password=***&x-auth=***"),
    ("/x?%74oken=abc&limit=1", "/x?%74oken=***&limit=1"),  # a percent-encoded name
    ("/x?q=msy_abc&r=mss_def&s=%20msy_x", "/x?q=***&r=***&s=***"),  # our tokens by value
    ("/x?token", "/x?token=***"),
])
def test_credentials_in_query_strings_are_redacted(target: str, logged: str) -> None:
    assert redact_query(target) == logged


def test_the_filter_rewrites_uvicorns_access_record() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d',
                               ("10.0.0.1:5", "GET", "/v1/jobs?token=msy_x", "1.1", 401), None)
    assert RedactQuerySecrets().filter(record)
    assert record.getMessage() == '10.0.0.1:5 - "GET /v1/jobs?token=*** HTTP/1.1" 401'
