"""/v1/jobs/{id}/...: what the control plane recorded about a job (read-only)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import JobDep, StoreDep
from api.params import After, AttemptQuery, RankQuery, SinceQuery, StepQuery
from api.responses import model_response
from api.schemas import (
    Attempt,
    AttemptList,
    CheckpointInfo,
    CheckpointList,
    Diagnosis,
    DiagnosisList,
    Event,
    EventList,
    GoodputOut,
    MetricList,
    MetricPoint,
    Rank,
    RankCondition,
    RankList,
    UsageList,
    UsagePoint,
)
from orchestrator.goodput import Goodput, from_records
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.watchdog.condition import JobCondition, rank_states
from orchestrator.watchdog.report import DiagnosisReport

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


def _open_rank_states(job: JobRecord, store: Store, attempt: int | None
                      ) -> dict[int, RankCondition]:
    """Per rank, what the job's open diagnosis says it is doing (empty without one)."""
    if not job.condition:
        return {}
    condition = JobCondition.from_dict(job.condition)
    if attempt not in (None, condition.attempt):
        return {}
    found = store.get_diagnosis(job.id, condition.diagnosis_id)
    if found is None:
        return {}
    states = rank_states(DiagnosisReport.from_dict(found.report))
    return {r: RankCondition.model_validate(c.to_dict()) for r, c in states.items()}


@router.get("/ranks", operation_id="listJobRanks", response_model=RankList)
def list_ranks(job: JobDep, store: StoreDep,
               attempt: AttemptQuery = None) -> Response:
    """Each rank as its controller last reported it; while a diagnosis is open, `condition`
    says what the diagnosis found it doing (the culprit not_joined, its peers waiting)."""
    ranks = store.list_ranks(job.id, attempt=attempt)
    states = _open_rank_states(job, store, attempt)
    return model_response(RankList(items=[
        Rank.model_validate(r).model_copy(update={"condition": states.get(r.rank)})
        for r in ranks]))


@router.get("/metrics", operation_id="listJobMetrics", response_model=MetricList)
def list_metrics(job: JobDep, store: StoreDep,
                 rank: RankQuery = None, after_step: StepQuery = None,
                 limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000) -> Response:
    points = store.list_metrics(job.id, rank=rank, after_step=after_step, limit=limit)
    return model_response(MetricList(items=[MetricPoint.model_validate(p) for p in points]))


@router.get("/usage", operation_id="listJobUsage", response_model=UsageList)
def list_usage(job: JobDep, store: StoreDep, attempt: AttemptQuery = None,
               rank: RankQuery = None, since: SinceQuery = None,
               limit: Annotated[int, Query(ge=1, le=20_000)] = 5000) -> Response:
    """Utilisation samples of the job's ranks (CPU, memory, GPU), oldest first; the newest
    `limit` when more match."""
    points = store.list_rank_usage(job.id, attempt=attempt, rank=rank, since=since,
                                   limit=limit)
    return model_response(UsageList(items=[UsagePoint.model_validate(p) for p in points]))


@router.get("/checkpoints", operation_id="listJobCheckpoints", response_model=CheckpointList)
def list_checkpoints(job: JobDep, store: StoreDep) -> Response:
    """The job's complete checkpoints, every attempt's, with step, time and size."""
    found = store.list_checkpoints(job.id)
    return model_response(CheckpointList(items=[CheckpointInfo.model_validate(c)
                                                for c in found]))


def job_goodput(job: JobRecord, store: Store) -> Goodput:
    """The job's goodput ledger now (orchestrator/goodput.py)."""
    return from_records(events=store.list_events(job.id, limit=10_000),
                        metrics=store.list_metrics(job.id, rank=0, limit=100_000),
                        diagnoses=store.list_diagnoses(job.id), now=time.time())


@router.get("/goodput", operation_id="getJobGoodput", response_model=GoodputOut)
def get_goodput(job: JobDep, store: StoreDep) -> Response:
    """Where the job's wall time went: queued, starting, productive, recomputed, hung,
    recovering, stopping (seconds that add up to `wall_s`), the ratio productive / wall, and
    the segments in time order (the dashboard's stacked bar)."""
    return model_response(GoodputOut.model_validate(job_goodput(job, store).to_dict()))


@router.get("/diagnoses", operation_id="listJobDiagnoses", response_model=DiagnosisList)
def list_diagnoses(job: JobDep, store: StoreDep) -> Response:
    # Newest first; the report's confidence and per-rank evidence are lifted to the top level.
    found = reversed(store.list_diagnoses(job.id))
    return model_response(DiagnosisList(items=[
        Diagnosis.model_validate(d).model_copy(update={
            "confidence": d.report.get("confidence"),
            "evidence": list(d.report.get("evidence") or [])}) for d in found]))
