"""/v1/jobs: submit, list, get, cancel.

Submission body (JSON, or YAML with Content-Type: application/yaml), either
  * a bare JobSpec: ``{"name": "demo", "parallelism": {"dp_replicate": 2}}``, or
  * a wrapper: ``{"spec": {...JobSpec...}, "submission_id": "my-retry-key"}``.
A submission id (wrapper field, or the ``Idempotency-Key`` header) makes retries safe: the same
(owner, submission id) always answers with the same job — 201 the first time, 200 after;
reusing the id with a different spec is a 422.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from api.admission import admit, check_policy
from api.deps import JobDep, SettingsDep, StoreDep, UserDep, WriterDep
from api.errors import ApiError, Unprocessable
from api.params import text_query
from api.responses import model_response
from api.routes.plans import record_plan, resolve_submitted, same_submission
from api.schemas import Job, JobPage, JobSummary, SubmitResult
from orchestrator.documents import parse_document
from orchestrator.lifecycle import JobState
from orchestrator.spec import FieldIssue, parse_spec
from orchestrator.store.jobs import BadCursor

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

WRAPPER_KEYS = frozenset({"spec", "submission_id"})
MAX_SUBMISSION_ID = 200
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")

SUBMIT_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A JobSpec (see `meshyard spec schema`), or {spec, submission_id}.",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


@dataclass(frozen=True)
class RawBody:
    text: str
    yaml: bool


async def raw_body(request: Request) -> RawBody:
    """Reads the body on the event loop (the body-limit middleware counts it as it streams)."""
    content_type = request.headers.get("content-type", "application/json").lower()
    kind = content_type.split(";")[0].strip()
    if kind not in YAML_TYPES and kind not in ("application/json", "") \
            and not kind.endswith("+json"):
        raise ApiError(415, f"unsupported Content-Type {kind!r}; send application/json or "
                       "application/yaml")
    data = await request.body()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unprocessable([FieldIssue("<root>", f"body is not UTF-8: {exc}",
                                        "parse_error")]) from None
    return RawBody(text=text, yaml=kind in YAML_TYPES)


def split_submission(data: Any, *, header_key: str | None) -> tuple[Any, str | None]:
    """Returns (spec data, submission id) from a bare spec or a {spec, submission_id} wrapper.

    >>> split_submission({"spec": {"name": "a"}, "submission_id": "k"}, header_key=None)
    ({'name': 'a'}, 'k')
    """
    body_key: Any = None
    spec_data = data
    if isinstance(data, dict) and "spec" in data:
        unknown = sorted(set(data) - WRAPPER_KEYS)
        if unknown:
            raise Unprocessable([FieldIssue(k, f"unknown field {k!r} next to `spec`; a wrapper "
                                            "holds only spec and submission_id",
                                            "extra_forbidden") for k in unknown])
        spec_data, body_key = data["spec"], data.get("submission_id")
    for loc, key in (("submission_id", body_key), ("header.Idempotency-Key", header_key)):
        if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= MAX_SUBMISSION_ID
                                or not key.isprintable()):
            raise Unprocessable([FieldIssue(loc, "must be a printable string of 1 to "
                                            f"{MAX_SUBMISSION_ID} characters", "value_error")])
    if body_key is not None and header_key is not None and body_key != header_key:
        raise Unprocessable([FieldIssue("submission_id", "differs from the Idempotency-Key "
                                        "header; send one, or the same value in both",
                                        "value_error")])
    return spec_data, body_key if body_key is not None else header_key


@router.post("", operation_id="submitJob", response_model=SubmitResult, status_code=201,
             openapi_extra=SUBMIT_BODY_DOC,
             responses={200: {"model": SubmitResult, "description": "Retry of an earlier "
                                                                   "submission."}})
def submit_job(body: Annotated[RawBody, Depends(raw_body)], user: WriterDep, store: StoreDep,
               settings: SettingsDep, request: Request,
               idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
               ) -> Response:
    """Checks in order: the document, the spec, the deployment policy (api/admission.py),
    `parallelism: auto`, cluster fit, quotas; then stores the job."""
    data = parse_document(body.text, yaml_body=body.yaml)
    spec_data, submission_id = split_submission(data, header_key=idempotency_key)
    submitted = parse_spec(spec_data)
    check_policy(submitted, user=user, settings=settings)
    spec, planned = resolve_submitted(submitted, store=store, settings=settings)  # auto
    quota = admit(spec, user=user, settings=settings, store=store,
                  shape=request.app.state.cluster_shape)
    job, created = store.submit_job(spec, owner=user.name, submission_id=submission_id,
                                    max_queued=quota.max_queued_jobs)
    if created and planned is not None:
        record_plan(store, job.id, planned)
    if created:
        _wake_scheduler(request)
    if not created and not same_submission(store, job, submitted=submitted, resolved=spec):
        # draft-ietf-httpapi-idempotency-key-header: a reused key with another payload is 422.
        raise Unprocessable([FieldIssue("submission_id", f"already used for job {job.id} with "
                                        "a different spec; choose a new submission_id",
                                        "idempotency_key_reused")])
    return model_response(SubmitResult.model_validate({**_fields(job), "created": created}),
                          status_code=201 if created else 200,
                          headers={"Location": f"/v1/jobs/{job.id}"})


def _wake_scheduler(request: Request) -> None:
    """Runs the in-process runtime's scheduler and poller passes now rather than at their
    next tick (up to `tick_s` later); a server without a runtime has nothing to wake."""
    poke = getattr(request.app.state.runtime, "poke", None)
    if callable(poke):
        poke()


def _fields(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in Job.model_fields}


@router.get("", operation_id="listJobs", response_model=JobPage)
def list_jobs(
    user: UserDep, store: StoreDep,
    state: Annotated[list[JobState] | None, Query(description="Repeat to match several.")]
    = None,
    owner: Annotated[str | None, text_query("Only this owner's jobs.")] = None,
    name: Annotated[str | None, text_query("Part of the job name.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, text_query("From next_cursor.")] = None,
) -> Response:
    try:
        jobs, next_cursor = store.list_jobs(
            viewer=user, state=[s.value for s in state] if state else None, owner=owner,
            name=name, limit=limit, cursor=cursor, with_spec=False)
    except BadCursor as exc:
        raise Unprocessable([FieldIssue("query.cursor", str(exc), "value_error")]) from None
    return model_response(JobPage(items=[JobSummary.model_validate(j) for j in jobs],
                                  next_cursor=next_cursor))


@router.get("/{job_id}", operation_id="getJob", response_model=Job)
async def get_job(job: JobDep) -> Response:
    return model_response(Job.model_validate(job))


@router.post("/{job_id}/cancel", operation_id="cancelJob", response_model=Job)
def cancel_job(job: JobDep, user: WriterDep, store: StoreDep, request: Request) -> Response:
    """Queued jobs end at once (CANCELLED); running ones go to CANCELLING and stop.
    Cancelling a finished job changes nothing and answers with the job."""
    cancelled = store.request_cancel(job.id, viewer=user)
    _wake_scheduler(request)
    return model_response(Job.model_validate(cancelled))
