"""/v1/jobs: submit, list, get, cancel.

Submission body (JSON, or YAML with Content-Type: application/yaml), either
  * a bare JobSpec: ``{"name": "demo", "parallelism": {"dp_replicate": 2}}``, or
  * a wrapper: ``{"spec": {...JobSpec...}, "submission_id": "my-retry-key"}``.
A submission id (wrapper field, or the ``Idempotency-Key`` header) makes retries safe: the same
(owner, submission id) always answers with the same job — 201 the first time, 200 after;
reusing the id with a different spec is a 422.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from api.admission import admit, check_policy
from api.deps import (
    ClusterShapeDep,
    JobDep,
    RuntimeDep,
    SettingsDep,
    StoreDep,
    UserDep,
    WriterDep,
)
from api.errors import ApiError, Unprocessable
from api.params import text_query
from api.responses import model_response
from api.schemas import Job, JobPage, JobSummary, SubmitResult
from api.state import RuntimeHooks
from api.submission import check_resume_from, record_plan, resolve_submitted, same_submission
from orchestrator.admission.documents import parse_document
from orchestrator.lifecycle import JobEventKind, JobState, Reason
from orchestrator.spec import FieldIssue, parse_spec, spec_warnings
from orchestrator.store.jobs import BadCursor, JobFacts
from orchestrator.store.records import JobRecord, UserRecord
from orchestrator.usercode.entrypoint import PACKAGE_RE, redact_env

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
               settings: SettingsDep, runtime: RuntimeDep, shape: ClusterShapeDep,
               idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
               working_dir: Annotated[str | None, Query(
                   max_length=80, pattern=PACKAGE_RE.pattern,
                   description="An uploaded package (`package:sha256:<hex>`, from POST "
                   "/v1/packages) set as the spec's `entrypoint.working_dir`: a spec written "
                   "without it runs that code.")] = None,
               ) -> Response:
    """Checks in order: the document, the spec, the deployment policy (api/admission.py),
    `parallelism: auto`, cluster fit, quotas; then stores the job. What in the spec is known
    to train badly comes back as `warnings` (and a warning event), the job accepted."""
    data = parse_document(body.text, yaml_body=body.yaml)
    spec_data, submission_id = split_submission(data, header_key=idempotency_key)
    if working_dir is not None:
        spec_data = with_working_dir(spec_data, working_dir)
    submitted = parse_spec(spec_data)
    check_policy(submitted, user=user, settings=settings, code_refusal=_code_refusal(runtime))
    spec, planned = resolve_submitted(submitted, store=store, settings=settings)  # auto
    check_resume_from(spec, user=user, store=store)
    quota = admit(spec, user=user, settings=settings, store=store,
                  shape=shape)
    job, created = store.submit_job(spec, owner=user.name, submission_id=submission_id,
                                    max_queued=quota.max_queued_jobs)
    if created and planned is not None:
        record_plan(store, job.id, planned)
    warnings = spec_warnings(spec)
    if created:
        for w in warnings:
            store.add_event(job.id, kind=JobEventKind.WARNING, reason=Reason.SPEC_WARNING.value,
                            message=f"{w.loc}: {w.msg}", data={"loc": w.loc})
        if runtime is not None:
            runtime.poke()  # schedule now rather than at the next tick
    if not created and not same_submission(store, job, submitted=submitted, resolved=spec):
        # draft-ietf-httpapi-idempotency-key-header: a reused key with another payload is 422.
        raise Unprocessable([FieldIssue("submission_id", f"already used for job {job.id} with "
                                        "a different spec; choose a new submission_id",
                                        "idempotency_key_reused")])
    shown = public_job(job, viewer=user)
    result = SubmitResult.model_validate({
        **_fields(shown), "created": created,
        "warnings": [{"loc": w.loc, "msg": w.msg} for w in warnings]})
    return model_response(result, status_code=201 if created else 200,
                          headers={"Location": f"/v1/jobs/{job.id}"})


def with_working_dir(spec_data: Any, working_dir: str) -> Any:
    """The spec with `entrypoint.working_dir` set (a spec without an entrypoint is a 422:
    only an entrypoint runs shipped code).

    >>> with_working_dir({"entrypoint": {"command": ["python", "t.py"]}}, "package:sha256:ab")
    {'entrypoint': {'command': ['python', 't.py'], 'working_dir': 'package:sha256:ab'}}
    """
    entry = spec_data.get("entrypoint") if isinstance(spec_data, dict) else None
    if not isinstance(entry, dict):
        raise Unprocessable([FieldIssue("entrypoint", "working_dir ships code for an "
                                        "entrypoint, but the spec has no `entrypoint` "
                                        "(command or function); add one", "missing")])
    return {**spec_data, "entrypoint": {**entry, "working_dir": working_dir}}


def _code_refusal(runtime: RuntimeHooks | None) -> str | None:
    """Why the in-process runtime refuses non-admins' code now (isolated mode on a host
    that cannot confine it); None without a runtime or when it confines."""
    return runtime.code_refusal() if runtime is not None else None


def _fields(record: Any) -> dict[str, Any]:
    return {name: record.spec_doc if name == "spec" else getattr(record, name)
            for name in Job.model_fields if hasattr(record, name) or name == "spec"}


@router.get("", operation_id="listJobs", response_model=JobPage)
def list_jobs(
    user: UserDep, store: StoreDep,
    state: Annotated[list[JobState] | None, Query(description="Repeat to match several.")]
    = None,
    owner: Annotated[str | None, text_query("Only this owner's jobs.")] = None,
    name: Annotated[str | None, text_query("Part of the job name.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, text_query("From next_cursor.")] = None,
    condition: Annotated[Literal["hung", "straggling"] | None, Query(
        description="Only jobs whose open diagnosis says they are hung (or straggling).")]
    = None,
) -> Response:
    try:
        jobs, next_cursor = store.list_jobs(
            viewer=user, state=[s.value for s in state] if state else None, owner=owner,
            name=name, limit=limit, cursor=cursor, condition=condition, with_spec=False)
    except BadCursor as exc:
        raise Unprocessable([FieldIssue("query.cursor", str(exc), "value_error")]) from None
    facts = store.job_facts([j.id for j in jobs])
    return model_response(JobPage(items=[with_facts(JobSummary.model_validate(j), facts)
                                         for j in jobs], next_cursor=next_cursor))


M = TypeVar("M", bound=JobSummary)


def with_facts(out: M, facts: dict[str, JobFacts]) -> M:
    """The job with what its events say: when it first ran, who cancelled it."""
    found = facts.get(out.id)
    if found is None:
        return out
    return out.model_copy(update={"started_at": found.started_at,
                                  "cancelled_by": found.cancelled_by})


@router.get("/{job_id}", operation_id="getJob", response_model=Job)
def get_job(job: JobDep, user: UserDep, store: StoreDep) -> Response:
    return model_response(with_facts(Job.model_validate(public_job(job, viewer=user)),
                                     store.job_facts([job.id])))


@router.post("/{job_id}/cancel", operation_id="cancelJob", response_model=Job)
def cancel_job(job: JobDep, user: WriterDep, store: StoreDep, runtime: RuntimeDep) -> Response:
    """Queued jobs end at once (CANCELLED); running ones go to CANCELLING and stop.
    Cancelling a finished job changes nothing and answers with the job."""
    cancelled = store.request_cancel(job.id, viewer=user)
    if runtime is not None:
        runtime.poke()
    return model_response(with_facts(Job.model_validate(public_job(cancelled, viewer=user)),
                                     store.job_facts([job.id])))


def public_job(job: JobRecord, *, viewer: UserRecord) -> JobRecord:
    """The job as `viewer` may see it: `entrypoint.env` values are write-only, shown as
    `***` to everyone but admins (its owner included)."""
    return job if viewer.is_admin else replace(job, spec_doc=redact_env(job.spec_doc or {}))
