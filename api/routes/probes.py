"""Probes and Prometheus: /healthz (process up), /readyz (database + schema), /metrics.

Probes need no token and name no job or user. /metrics without a token shows the
cluster-level series only (or nothing: MESHYARD_METRICS_ANONYMOUS=off); with a bearer token it
adds the series of the jobs that token may read (api/metrics.py). Only a bearer token counts
here, never the dashboard's cookie: scrapers send tokens, and /metrics answers any Host.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from api.auth import authenticate, bearer_token
from api.deps import StateDep
from api.errors import Unauthorized
from api.readiness import check_ready
from api.schemas import Health, Problem, Readiness

router = APIRouter(tags=["ops"])


@router.get("/healthz", operation_id="healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", operation_id="readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "Not ready."}})
def readyz(state: StateDep) -> Response:
    result = check_ready(state.engine)
    return JSONResponse(result.model_dump(), status_code=200 if result.status == "ready" else 503)


@router.get("/metrics", operation_id="prometheusMetrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                             "description": "Prometheus text exposition."},
                       401: {"model": Problem}, 500: {"model": Problem}})
async def prometheus_metrics(request: Request, state: StateDep) -> Response:
    viewer = None
    if bearer_token(request) is not None:
        viewer = await authenticate(request, state.store, state.token_cache,
                                    state.login_throttle)
    elif state.settings.metrics_anonymous == "off":
        raise Unauthorized("this server shows /metrics only with a bearer token "
                           "(MESHYARD_METRICS_ANONYMOUS=off); give the scraper one "
                           "(`meshyard token create`)")
    body = await run_in_threadpool(state.http_metrics.render, viewer)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
