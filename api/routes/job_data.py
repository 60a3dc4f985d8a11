"""/v1/jobs/{id}/...: what the control plane recorded about a job (read-only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import JobDep, StoreDep
from api.params import After, AttemptQuery, RankQuery, StepQuery
from api.responses import model_response
from api.schemas import (
    Attempt,
    AttemptList,
    Diagnosis,
    DiagnosisList,
    Event,
    EventList,
    LogLine,
    LogList,
    MetricList,
    MetricPoint,
    Rank,
    RankList,
)

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["job data"])



@router.get("/events", operation_id="listJobEvents", response_model=EventList)
def list_events(job: JobDep, store: StoreDep, after: After = 0,
                limit: Annotated[int, Query(ge=1, le=5000)] = 1000) -> Response:
    events = store.list_events(job.id, after=after, limit=limit)
    return model_response(EventList(items=[Event.model_validate(e) for e in events]))


@router.get("/attempts", operation_id="listJobAttempts", response_model=AttemptList)
def list_attempts(job: JobDep, store: StoreDep) -> Response:
    attempts = store.list_attempts(job.id)
    return model_response(AttemptList(items=[Attempt.model_validate(a) for a in attempts]))


@router.get("/ranks", operation_id="listJobRanks", response_model=RankList)
def list_ranks(job: JobDep, store: StoreDep,
               attempt: AttemptQuery = None) -> Response:
    ranks = store.list_ranks(job.id, attempt=attempt)
    return model_response(RankList(items=[Rank.model_validate(r) for r in ranks]))


@router.get("/metrics", operation_id="listJobMetrics", response_model=MetricList)
def list_metrics(job: JobDep, store: StoreDep,
                 rank: RankQuery = None, after_step: StepQuery = None,
                 limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000) -> Response:
    points = store.list_metrics(job.id, rank=rank, after_step=after_step, limit=limit)
    return model_response(MetricList(items=[MetricPoint.model_validate(p) for p in points]))


@router.get("/logs", operation_id="listJobLogs", response_model=LogList)
def list_logs(job: JobDep, store: StoreDep, after: After = 0,
              rank: RankQuery = None,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
              tail: Annotated[int | None, Query(ge=1, le=10_000,
                                                description="Only the last N lines.")] = None,
              ) -> Response:
    lines = store.list_logs(job.id, rank=rank, after=after, limit=limit, tail=tail)
    return model_response(LogList(items=[LogLine.model_validate(line) for line in lines]))


@router.get("/diagnoses", operation_id="listJobDiagnoses", response_model=DiagnosisList)
def list_diagnoses(job: JobDep, store: StoreDep) -> Response:
    # Newest first; the report's confidence and per-rank evidence are lifted to the top level.
    found = reversed(store.list_diagnoses(job.id))
    return model_response(DiagnosisList(items=[
        Diagnosis.model_validate(d).model_copy(update={
            "confidence": d.report.get("confidence"),
            "evidence": list(d.report.get("evidence") or [])}) for d in found]))
