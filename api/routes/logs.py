"""GET /v1/jobs/{id}/logs/follow: a job's log lines as they arrive (NDJSON stream).

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
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from api.auth import Credential, credential, lookup
from api.deps import JobDep, StoreDep, UserDep
from api.params import After, RankQuery
from api.schemas import LogLine
from api.streams import SlotStreamingResponse
from orchestrator.lifecycle import JobState
from orchestrator.store.repo import Store

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["job data"])
_POLL_S = 0.5
_BATCH = 1000
RECHECK_S = 2.0


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
                      rank: RankQuery = None,
                      tail: Annotated[int | None, Query(
                          ge=1, le=10_000, description="Start with the last N lines.")] = 100,
                      after: After = 0,
                      ) -> StreamingResponse:
    cred = credential(request)
    assert cred is not None  # JobDep authenticated the caller with it
    release = request.app.state.stream_slots.acquire(user.id, user.name)
    return SlotStreamingResponse(_follow(store, request, job_id=job.id, rank=rank, after=after,
                                         tail=tail, cred=cred),
                                 release=release, media_type="application/x-ndjson")
