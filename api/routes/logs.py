"""A job's log lines: GET /v1/jobs/{id}/logs (filtered, paged), /logs/download (one rank's
whole log as text) and /logs/follow (as they arrive, NDJSON).

Filters: `attempt`, `rank`, `stream` (stdout | stderr | log), `q` (lines containing it).
Paging: `after=<id>` reads forward (polling), `before=<id>` the page of older lines before
the oldest one shown, `tail=N` the newest N.

The control plane writes every rank's stdout / stderr / log lines into the store (the
controller forwards them, the poller writes them); this route replays the last `tail` lines
(or everything after `after`) and then streams new ones until the job is terminal and its
lines are drained, or the client goes away. One JSON object (a LogLine) per line.

A stream outlives the request that authorized it, so it asks the store again every
`RECHECK_S` whether the caller's token (or dashboard session) is still live and the job still
theirs to see, and ends when not. A user holds at most `max_streams_per_user` streams (429
beyond, see api/streams.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from api.auth import Credential, credential, lookup
from api.deps import JobDep, StoreDep, StreamSlotsDep, UserDep
from api.params import After, AttemptQuery, RankQuery, text_query
from api.responses import model_response
from api.schemas import LogLine, LogList
from api.streams import SlotStreamingResponse
from orchestrator.bounds.limits import INT32_MAX, INT64_MAX
from orchestrator.lifecycle import JobState, LogStream
from orchestrator.store.repo import Store

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["job data"])
_POLL_S = 0.5
_BATCH = 1000
RECHECK_S = 2.0


Stream = LogStream
_DOWNLOAD_BATCH = 5000


@router.get("/logs", operation_id="listJobLogs", response_model=LogList)
def list_logs(job: JobDep, store: StoreDep, after: After = 0,
              rank: RankQuery = None, attempt: AttemptQuery = None,
              stream: Annotated[Stream | None, Query(description="Only this stream.")] = None,
              q: Annotated[str | None, text_query("Only lines containing this text.")] = None,
              before: Annotated[int | None, Query(ge=1, le=INT64_MAX, description=(
                  "The newest lines with id < before (the page before the oldest shown)."))]
              = None,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
              tail: Annotated[int | None, Query(ge=1, le=10_000,
                                                description="Only the last N lines.")] = None,
              ) -> Response:
    lines = store.list_logs(job.id, rank=rank, after=after, limit=limit, tail=tail,
                            attempt=attempt, stream=stream, contains=q or None, before=before)
    return model_response(LogList(items=[LogLine.model_validate(line) for line in lines]))


@router.get("/logs/download", operation_id="downloadRankLog",
            response_class=StreamingResponse,
            responses={200: {"content": {"text/plain": {}},
                             "description": "Every line of the rank's log, oldest first."}})
def download_log(job: JobDep, store: StoreDep,
                 rank: Annotated[int, Query(ge=0, le=INT32_MAX, description="The rank.")],
                 attempt: AttemptQuery = None,
                 stream: Annotated[Stream | None, Query(description="Only this stream.")]
                 = None) -> StreamingResponse:
    """One rank's whole log of one attempt (default: the current one) as a text file, read
    from the store in batches."""
    number = attempt or job.current_attempt

    def lines() -> Iterator[bytes]:
        after = 0
        while True:
            batch = store.list_logs(job.id, rank=rank, attempt=number, stream=stream,
                                    after=after, limit=_DOWNLOAD_BATCH)
            if not batch:
                return
            after = batch[-1].id
            yield "".join(f"{x.line}\n" for x in batch).encode()
            if len(batch) < _DOWNLOAD_BATCH:
                return

    name = f"{job.id}-attempt{number}-rank{rank}.log"
    return StreamingResponse(lines(), media_type="text/plain; charset=utf-8",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _encode(record: Any) -> bytes:
    return (json.dumps(LogLine.model_validate(record).model_dump(mode="json")) + "\n").encode()


async def _follow(store: Store, request: Request, *, job_id: str, rank: int | None,
                  after: int, tail: int | None, cred: Credential) -> AsyncIterator[bytes]:
    first = await asyncio.to_thread(store.list_logs, job_id, rank=rank, after=after,
                                    limit=_BATCH, tail=tail if not after else None)
    last = after
    for rec in first:
        last = rec.id
        yield _encode(rec)
    checked, viewer = time.monotonic(), None
    while not await request.is_disconnected():
        if viewer is None or time.monotonic() - checked >= RECHECK_S:
            viewer = await asyncio.to_thread(lookup, store, cred)
            checked = time.monotonic()
            if viewer is None:
                return  # revoked, logged out or expired: the stream ends with its credential
        job = await asyncio.to_thread(store.get_job, job_id, viewer=viewer)
        batch = await asyncio.to_thread(store.list_logs, job_id, rank=rank, after=last,
                                        limit=_BATCH)
        for rec in batch:
            last = rec.id
            yield _encode(rec)
        # The job state is read before the batch: terminal then means no line can follow.
        if job is None or JobState(job.state).terminal and len(batch) < _BATCH:
            return
        if len(batch) < _BATCH:
            await asyncio.sleep(_POLL_S)


@router.get("/logs/follow", operation_id="followJobLogs",
            response_class=StreamingResponse,
            responses={200: {"content": {"application/x-ndjson": {}},
                             "description": "One LogLine JSON object per line."}})
async def follow_logs(job: JobDep, user: UserDep, store: StoreDep, request: Request,
                      slots: StreamSlotsDep,
                      rank: RankQuery = None,
                      tail: Annotated[int | None, Query(
                          ge=1, le=10_000, description="Start with the last N lines.")] = 100,
                      after: After = 0,
                      ) -> StreamingResponse:
    cred = credential(request)
    assert cred is not None  # JobDep authenticated the caller with it
    release = slots.acquire(user.id, user.name)
    return SlotStreamingResponse(_follow(store, request, job_id=job.id, rank=rank, after=after,
                                         tail=tail, cred=cred),
                                 release=release, media_type="application/x-ndjson")
