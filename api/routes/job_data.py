"""/v1/jobs/{id}/...: what the control plane recorded about a job (read-only), and a complete
checkpoint's files as a download."""

from __future__ import annotations

import os
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import StreamingResponse

from api.deps import JobDep, SettingsDep, StoreDep
from api.errors import ApiError, NotFound, Unprocessable
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
    MetricSeries,
    MetricSeriesPage,
    Rank,
    RankCondition,
    RankList,
    UsageList,
    UsagePoint,
)
from api.store_views import job_goodput
from orchestrator.bounds.limits import INT32_MAX
from orchestrator.isolation import runfiles
from orchestrator.settings import Settings
from orchestrator.spec import FieldIssue
from orchestrator.storage.object_storage import StorageError
from orchestrator.store.metric_values import FIXED_FIELDS, MAX_KEYS_PER_JOB, valid_key
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


MAX_VALUES = 200_000  # extra values one /metrics page may carry (rows x keys)
MAX_SERIES_KEYS = 32
MAX_SERIES_RANKS = 16
KeysQuery = Annotated[str | None, Query(
    max_length=MAX_KEYS_PER_JOB * 65, pattern=r"^[A-Za-z0-9_.:/,-]*$",
    description="Comma-separated metric names; default: every one the job stored.")]


def _names(raw: str | None, *, most: int) -> list[str] | None:
    if raw is None:
        return None
    names = list(dict.fromkeys(k for k in raw.split(",") if k))
    bad = [k for k in names if not valid_key(k)]
    if bad:
        raise ApiError(422, f"keys: {bad[0]!r} is not a metric name (1-64 characters of letters, "
                         "digits and _ . : / -, starting with a letter or _)")
    if len(names) > most:
        raise ApiError(422, f"keys: {len(names)} names; at most {most} per request")
    return names


@router.get("/metrics", operation_id="listJobMetrics", response_model=MetricList)
def list_metrics(job: JobDep, store: StoreDep,
                 rank: RankQuery = None, after_step: StepQuery = None,
                 limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
                 keys: KeysQuery = None) -> Response:
    """The raw rows, step order: the fixed fields, and in `values` the other metrics the
    job reported (those `keys` names; `keys=` for none). A page carries at most 200,000
    values: with many keys, fewer rows than `limit` (page on with `after_step`)."""
    names = _names(keys, most=MAX_KEYS_PER_JOB)
    stored = store.list_metric_keys(job.id)
    wanted = stored if names is None else [k for k in names if k in stored]
    if wanted:
        limit = min(limit, max(1, MAX_VALUES // len(wanted)))
    points = store.list_metrics(job.id, rank=rank, after_step=after_step, limit=limit)
    values = store.list_extra_values(job.id, rank=rank, first_step=points[0].step,
                                     last_step=points[-1].step, keys=wanted) \
        if points and wanted else {}
    return model_response(MetricList(keys=stored, items=[
        MetricPoint.model_validate(p).model_copy(update={
            "values": values.get((p.attempt, p.rank, p.step), {})}) for p in points]))


@router.get("/metrics/series", operation_id="getJobMetricSeries",
            response_model=MetricSeriesPage)
def metric_series(job: JobDep, store: StoreDep,
                  keys: Annotated[str, Query(
                      min_length=1, max_length=MAX_SERIES_KEYS * 65,
                      pattern=r"^[A-Za-z0-9_.:/,-]+$",
                      description="Comma-separated metric names, fixed or reported (at most "
                      f"{MAX_SERIES_KEYS}).")],
                  ranks: Annotated[str, Query(
                      max_length=MAX_SERIES_RANKS * 11, pattern=r"^[0-9]+(,[0-9]+)*$",
                      description=f"Comma-separated ranks (at most {MAX_SERIES_RANKS}).")] = "0",
                  points: Annotated[int, Query(ge=10, le=2000, description=(
                      "Buckets per series at most."))] = 400,
                  from_step: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
                  to_step: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None) -> Response:
    """Each (key, rank) downsampled on the server: the steps in [from_step, to_step] are cut
    into at most `points` buckets of equal width, and each bucket gives its first step and
    time, mean, min and max (a spike survives as its bucket's max) and its row count. A range
    of fewer steps than `points` returns every row (`bucket_steps` 1). The raw rows are
    `GET .../metrics`."""
    names = _names(keys, most=MAX_SERIES_KEYS) or []
    rank_list = sorted({int(x) for x in ranks.split(",")})
    if len(rank_list) > MAX_SERIES_RANKS or rank_list[-1] > INT32_MAX:
        raise ApiError(422, f"ranks: at most {MAX_SERIES_RANKS} ranks, each at most {INT32_MAX}")
    if from_step is not None and to_step is not None and to_step < from_step:
        raise ApiError(422, f"to_step {to_step} is before from_step {from_step}")
    stored = store.list_metric_keys(job.id)
    known = set(stored) | set(FIXED_FIELDS)
    page = store.metric_series(job.id, keys=[k for k in names if k in known], ranks=rank_list,
                               points=points, from_step=from_step, to_step=to_step)
    return model_response(MetricSeriesPage(
        keys=stored, fixed=list(FIXED_FIELDS), from_step=page.from_step, to_step=page.to_step,
        bucket_steps=page.bucket_steps, rows=page.rows,
        items=[MetricSeries.model_validate(x) for x in page.series]))


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


MAX_CHECKPOINT_DOWNLOAD_BYTES = 4 * 2**30  # a checkpoint larger than this is not served
MAX_CHECKPOINT_FILES = 10_000
_CHUNK = 1 << 20


@router.get("/checkpoints/{attempt}/{step}/download", operation_id="downloadJobCheckpoint",
            response_class=StreamingResponse,
            responses={200: {"content": {"application/x-tar": {}},
                             "description": "The checkpoint's files, as an uncompressed tar."}})
def download_checkpoint(job: JobDep, store: StoreDep, settings: SettingsDep,
                        attempt: Annotated[int, Path(ge=1, le=INT32_MAX)],
                        step: Annotated[int, Path(ge=0, le=INT32_MAX)]) -> StreamingResponse:
    """One complete checkpoint (GET .../checkpoints lists them) as a tar of its folder, read
    only from inside the job's own run dir or checkpoint storage folder, never through a link
    (a link or a special file anywhere in it refuses the download), at most
    MAX_CHECKPOINT_FILES files and MAX_CHECKPOINT_DOWNLOAD_BYTES."""
    found = next((c for c in store.list_checkpoints(job.id)
                  if c.attempt == attempt and c.step == step), None)
    if found is None:
        raise NotFound(f"job {job.id} has no checkpoint of step {step} in attempt {attempt}; "
                       f"GET /v1/jobs/{job.id}/checkpoints lists them")
    if found.removed:
        raise NotFound(f"the checkpoint of step {step} was pruned from disk "
                       "(checkpoint.keep); a newer one is kept")
    if found.path.startswith("s3://"):
        return _download_from_store(settings, job.id, step)
    run_dir = FsPath(settings.resolved_runs_dir).resolve() / job.id
    if settings.checkpoint_storage is not None:  # on the shared storage, where it was written
        stored = settings.checkpoint_storage.resolve() / job.id
        if FsPath(found.path).is_relative_to(stored):
            run_dir = stored
    try:
        files = runfiles.walk_files(run_dir, found.path, max_files=MAX_CHECKPOINT_FILES)
    except runfiles.UnsafePath as exc:
        raise Unprocessable([FieldIssue("path", f"not served: {exc}", "unsafe_path")]) from None
    except ValueError as exc:
        raise ApiError(413, f"the checkpoint holds {exc}; copy it from the node") from None
    except OSError:
        raise NotFound(f"the checkpoint of step {step} is not on this server's disk "
                       f"({found.path})") from None
    total = sum(size for _, size in files)
    if total > MAX_CHECKPOINT_DOWNLOAD_BYTES:
        raise ApiError(413, f"the checkpoint is {total} bytes, over the "
                       f"{MAX_CHECKPOINT_DOWNLOAD_BYTES}-byte download limit; copy it from "
                       "the node")
    base = FsPath(found.path)
    base = base if base.is_absolute() else run_dir / base
    return _tar_response(f"{job.id}-step{step}", files, int(found.at.timestamp()),
                         lambda name: os.fdopen(runfiles.open_read(run_dir, base / name), "rb"))


def _download_from_store(settings: Settings, job_id: str, step: int) -> StreamingResponse:
    """A checkpoint on the cluster's checkpoint store: its objects under the job's own folder
    there (named from the job and the step, never from a stored path)."""
    storage = settings.object_storage()
    if storage is None:
        raise NotFound(f"the checkpoint of step {step} is on object storage, and this server "
                       "has no checkpoint store configured (MESHYARD_CHECKPOINT_URI)")
    try:
        fs = storage.filesystem()
        if step not in storage.complete_steps(job_id, fs=fs):
            raise NotFound(f"the checkpoint of step {step} is no longer in {storage.uri} "
                           "(checkpoint.keep pruned it)")
        files = storage.step_files(job_id, step, fs=fs, max_files=MAX_CHECKPOINT_FILES)
    except StorageError as exc:
        raise ApiError(503, str(exc)) from None
    except ValueError as exc:
        raise ApiError(413, f"the checkpoint holds {exc}; copy it from the store") from None
    total = sum(size for _, size in files)
    if total > MAX_CHECKPOINT_DOWNLOAD_BYTES:
        raise ApiError(413, f"the checkpoint is {total} bytes, over the "
                       f"{MAX_CHECKPOINT_DOWNLOAD_BYTES}-byte download limit; copy it from "
                       f"{storage.step_uri(job_id, step)}")
    base = storage.step_path(job_id, step)
    return _tar_response(f"{job_id}-step{step}", files, int(time.time()),
                         lambda name: fs.open_input_stream(f"{base}/{name}"))


def _tar_response(folder: str, files: list[tuple[str, int]], mtime: int,
                  open_file: Callable[[str], Any]) -> StreamingResponse:
    """An uncompressed tar of `files` ((name, size) as listed) under `folder`, streamed; a
    file that shrank since it was listed keeps its listed size (zero-filled)."""

    def chunks() -> Iterator[bytes]:
        for name, size in files:
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size, info.mode, info.mtime = size, 0o644, mtime
            yield info.tobuf(format=tarfile.PAX_FORMAT)
            left = size
            with open_file(name) as f:
                while left > 0:
                    data = f.read(min(_CHUNK, left))
                    if not data:
                        break
                    left -= len(data)
                    yield data
            if left:
                yield b"\0" * left
            if size % tarfile.BLOCKSIZE:
                yield b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)

    return StreamingResponse(chunks(), media_type="application/x-tar", headers={
        "Content-Disposition": f'attachment; filename="{folder}.tar"'})


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
