"""The one exception-to-HTTP mapping: every error leaves the API as application/problem+json.

Shape (RFC 9457): ``{"type", "title", "status", "detail", "instance"}`` plus, for validation
errors, ``"errors": [{"loc": "parallelism.tp", "msg": "...", "type": "..."}]``; a quota
answer (429) adds ``"quota"`` and ``"limit"``, a policy refusal ``"policy"`` and ``"setting"``.
Routes raise domain exceptions (SpecValidationError, IllegalTransition) or the small
ApiError family below; nothing else in api/ builds error responses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.admission.access import Violation
from orchestrator.admission.quotas import QuotaExceeded
from orchestrator.lifecycle import IllegalTransition
from orchestrator.spec import FieldIssue, SpecValidationError
from orchestrator.store.jobs import JobNotFound

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger(__name__)


class ApiError(StarletteHTTPException):
    """An HTTP error with a problem type. Subclasses StarletteHTTPException on purpose:
    FastAPI re-raises HTTPExceptions raised while it reads a body instead of turning them
    into a generic 400, so a body-limit error stays a 413."""

    problem_type = "about:blank"

    def __init__(self, status: int, detail: str, *, headers: dict[str, str] | None = None,
                 errors: list[FieldIssue] | None = None,
                 extensions: Mapping[str, Any] | None = None) -> None:
        super().__init__(status_code=status, detail=detail, headers=headers)
        self.errors = errors or []
        self.extensions = dict(extensions or {})


class NotFound(ApiError):
    problem_type = "urn:meshyard:problem:not-found"

    def __init__(self, detail: str) -> None:
        super().__init__(404, detail)


class Unauthorized(ApiError):
    problem_type = "urn:meshyard:problem:unauthorized"

    def __init__(self, detail: str) -> None:
        super().__init__(401, detail, headers={"WWW-Authenticate": 'Bearer realm="meshyard"'})


class Forbidden(ApiError):
    problem_type = "urn:meshyard:problem:forbidden"

    def __init__(self, detail: str) -> None:
        super().__init__(403, detail)


class PolicyRefused(ApiError):
    """The deployment policy refuses the request: 403 for the caller's role, 422 (at a
    field) for what the spec asks; both name the policy and the setting that changes it."""

    problem_type = "urn:meshyard:problem:policy"

    def __init__(self, violations: list[Violation]) -> None:
        first = violations[0]
        forbidden = any(v.forbidden for v in violations)
        issues = [FieldIssue(v.loc, v.msg, f"policy.{v.policy}") for v in violations]
        super().__init__(403 if forbidden else 422, _summary(issues), errors=issues,
                         extensions={"policy": first.policy, "setting": first.setting})


class TooManyRequests(ApiError):
    """429: a quota or a concurrency limit; names it and its value."""

    problem_type = "urn:meshyard:problem:quota-exceeded"

    def __init__(self, detail: str, *, quota: str, limit: float) -> None:
        super().__init__(429, detail, extensions={"quota": quota, "limit": limit})


class LoginThrottled(ApiError):
    """429: too many failed logins from the caller's address (api/throttle.py)."""

    problem_type = "urn:meshyard:problem:login-throttled"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(429, f"too many failed logins from this address; try again in "
                         f"{retry_after_s} s with a valid token (`meshyard token create`)",
                         headers={"Retry-After": str(retry_after_s)},
                         extensions={"setting": "MESHYARD_LOGIN_FAILURES_MAX",
                                     "retry_after_s": retry_after_s})


class Conflict(ApiError):
    problem_type = "urn:meshyard:problem:conflict"

    def __init__(self, detail: str) -> None:
        super().__init__(409, detail)


class BodyTooLarge(ApiError):
    problem_type = "urn:meshyard:problem:body-too-large"

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {limit} bytes")


class Unprocessable(ApiError):
    """422 built from FieldIssues (spec problems found outside parse_spec, e.g. cluster fit)."""

    problem_type = "urn:meshyard:problem:validation"

    def __init__(self, issues: list[FieldIssue], *,
                 extensions: Mapping[str, Any] | None = None) -> None:
        super().__init__(422, _summary(issues), errors=issues, extensions=extensions)


def _summary(issues: list[FieldIssue]) -> str:
    head = "; ".join(f"{i.loc}: {i.msg}" for i in issues[:3])
    more = f" (and {len(issues) - 3} more)" if len(issues) > 3 else ""
    return f"invalid request: {head}{more}"


def problem(*, status: int, detail: str, instance: str, problem_type: str = "about:blank",
            errors: list[FieldIssue] | None = None,
            headers: Mapping[str, str] | None = None,
            extensions: Mapping[str, Any] | None = None) -> JSONResponse:
    """A problem+json response; `extensions` are extra members (RFC 9457 section 3.2)."""
    body: dict[str, Any] = {**(extensions or {}),
        "type": problem_type,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors is not None:
        body["errors"] = [{"loc": i.loc, "msg": i.msg, "type": i.type} for i in errors]
    return JSONResponse(body, status_code=status, headers=dict(headers or {}),
                        media_type=PROBLEM_JSON)


def _request_loc(loc: tuple[Any, ...]) -> str:
    # FastAPI prefixes the source ("query", "path", "header", "body"); keep it for parameters
    # so "query.limit" is unambiguous, but drop "body" so spec fields read "parallelism.tp".
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "<root>"


def _validation_issues(exc: RequestValidationError) -> list[FieldIssue]:
    return [FieldIssue(_request_loc(tuple(e.get("loc", ()))), str(e.get("msg", "")),
                       str(e.get("type", "value_error"))) for e in exc.errors()]


def install_error_handlers(app: FastAPI) -> None:
    """Registers the mapping on an app. Called once by create_app."""

    async def on_spec_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SpecValidationError)
        return problem(status=422, detail=_summary(exc.issues), instance=request.url.path,
                       problem_type=Unprocessable.problem_type, errors=exc.issues)

    async def on_request_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        issues = _validation_issues(exc)
        return problem(status=422, detail=_summary(issues), instance=request.url.path,
                       problem_type=Unprocessable.problem_type, errors=issues)

    async def on_illegal_transition(request: Request, exc: Exception) -> JSONResponse:
        return problem(status=409, detail=str(exc), instance=request.url.path,
                       problem_type=Conflict.problem_type)

    async def on_job_not_found(request: Request, exc: Exception) -> JSONResponse:
        return problem(status=404, detail=str(exc), instance=request.url.path,
                       problem_type=NotFound.problem_type)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc, ApiError):
            return problem(status=exc.status_code, detail=str(exc.detail),
                           instance=request.url.path, problem_type=exc.problem_type,
                           errors=exc.errors or None, headers=exc.headers,
                           extensions=exc.extensions)
        return problem(status=exc.status_code, detail=str(exc.detail),
                       instance=request.url.path, headers=exc.headers)

    async def on_quota(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, QuotaExceeded)
        return problem(status=429, detail=str(exc), instance=request.url.path,
                       problem_type=TooManyRequests.problem_type,
                       extensions={"quota": exc.quota, "limit": exc.limit})

    async def on_unhandled(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server log, never to the client.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(status=500, detail="internal server error; see the server log",
                       instance=request.url.path)

    app.add_exception_handler(SpecValidationError, on_spec_error)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(IllegalTransition, on_illegal_transition)
    app.add_exception_handler(JobNotFound, on_job_not_found)
    app.add_exception_handler(QuotaExceeded, on_quota)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unhandled)
