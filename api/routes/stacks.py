"""/v1/jobs/{id}/stacks: "stacks now", every rank's Python stacks on demand.

POST records a request (one open at a time per job; the job must have running workers); the
leader's runtime has the attempt's controller collect the stacks through the hang watchdog's
diagnostics path (orchestrator/runtime/stack_requests.py). GET answers with its state and,
once done, the stacks grouped: ranks whose threads stand in the same user and library frames
merged (orchestrator/watchdog/stacks.py), each frame marked user, library or wrapper.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from api.deps import JobDep, StoreDep, WriterDep
from api.errors import Conflict, NotFound
from api.responses import model_response
from api.schemas import StackRequest, StackRequestList
from orchestrator.bounds.limits import INT32_MAX
from orchestrator.lifecycle import JobState
from orchestrator.store.records import StackRequestRecord
from orchestrator.store.stack_requests import StackRequestBusy
from orchestrator.watchdog.stacks import parse_frames

router = APIRouter(prefix="/v1/jobs/{job_id}/stacks", tags=["job data"])
_WITH_WORKERS = (JobState.STARTING, JobState.RUNNING, JobState.CANCELLING)


def _with_frames(group: dict[str, Any]) -> dict[str, Any]:
    """A group stored before frames were parsed gets them from its text."""
    if "frames" in group or not isinstance(group.get("stack"), str):
        return group
    return {**group, "frames": [f.to_dict() for f in parse_frames(group["stack"])]}


def _out(record: StackRequestRecord) -> StackRequest:
    result: dict[str, Any] = record.result or {}
    return StackRequest.model_validate({
        "id": record.id, "job_id": record.job_id, "attempt": record.attempt,
        "requested_by": record.requested_by, "requested_at": record.requested_at,
        "state": record.state, "finished_at": record.finished_at,
        "groups": [_with_frames(g) for g in result.get("groups") or []],
        "ranks_answered": result.get("ranks_answered", 0),
        "errors": result.get("errors") or {}, "error": result.get("error") or "",
        "native": result.get("native") or []})


@router.post("", operation_id="requestStacks", response_model=StackRequest, status_code=202)
def request_stacks(job: JobDep, user: WriterDep, store: StoreDep) -> Response:
    if job.state not in _WITH_WORKERS or job.current_attempt < 1:
        raise Conflict(f"job {job.id} is {job.state.value}: only a job with running workers "
                       "has stacks to collect")
    try:
        record = store.request_stacks(job.id, attempt=job.current_attempt,
                                      requested_by=user.name)
    except StackRequestBusy as exc:
        raise Conflict(f"{exc}; GET /v1/jobs/{job.id}/stacks/{exc.request_id}") from None
    return model_response(_out(record), status_code=202,
                          headers={"Location": f"/v1/jobs/{job.id}/stacks/{record.id}"})


@router.get("", operation_id="listStacks", response_model=StackRequestList)
def list_stack_requests(job: JobDep, store: StoreDep) -> Response:
    """The job's latest requests, newest first."""
    return model_response(StackRequestList(items=[_out(r) for r in
                                                  store.list_stack_requests(job.id)]))


@router.get("/{request_id}", operation_id="getStacks", response_model=StackRequest)
def get_stacks(job: JobDep, store: StoreDep,
               request_id: Annotated[int, Path(ge=1, le=INT32_MAX)]) -> Response:
    record = store.get_stack_request(job.id, request_id)
    if record is None:
        raise NotFound(f"no stacks request {request_id} for job {job.id}")
    return model_response(_out(record))
