"""Probes and Prometheus: /healthz (process up), /readyz (database + schema), /metrics.

No authentication: probes and scrapers carry no tokens, and nothing here names a job or user.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from api.readiness import check_ready
from api.schemas import Health, Problem, Readiness

router = APIRouter(tags=["ops"])


@router.get("/healthz", operation_id="healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", operation_id="readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "Not ready."}})
def readyz(request: Request) -> Response:
    result = check_ready(request.app.state.engine)
    return JSONResponse(result.model_dump(), status_code=200 if result.status == "ready" else 503)


@router.get("/metrics", operation_id="prometheusMetrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                             "description": "Prometheus text exposition."},
                       500: {"model": Problem}})
def prometheus_metrics(request: Request) -> Response:
    return Response(request.app.state.http_metrics.render(), media_type=CONTENT_TYPE_LATEST)
