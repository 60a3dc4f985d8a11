"""The app factory: ``create_app(settings, store=..., runtime=...)``.

`runtime` is the hook for the scheduler / controllers: any object with ``start()`` and
``stop()`` (plain or async). It starts after the app is wired and stops before the database
engine is closed, so the API runs without Ray when it is None (tests, `--no-scheduler`).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.routing import APIRoute
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from api import docs
from api.admission import ClusterShape
from api.auth import TokenCache
from api.errors import install_error_handlers
from api.metrics import HttpMetrics
from api.middleware import BodyLimitMiddleware, HostCheckMiddleware, MetricsMiddleware
from api.routes import (
    cluster,
    health,
    job_data,
    jobs,
    logs,
    nodes,
    packages,
    plans,
    stacks,
    tokens,
    ui,
    users,
)
from api.schemas import Problem
from api.streams import StreamSlots
from orchestrator.settings import Settings, get_settings
from orchestrator.store.db import make_engine
from orchestrator.store.repo import Store

# Goodput is computed per job at scrape time (three reads each): the first N active jobs.
MAX_GOODPUT_SERIES = 200


class Runtime(Protocol):
    def start(self) -> Any: ...  # may return an awaitable
    def stop(self) -> Any: ...


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": text,
             "content": {"application/problem+json": {}}}
    for status, text in ((401, "Missing or invalid bearer token."),
                         (403, "The caller's role or the deployment policy refuses it."),
                         (404, "Not found (or not visible to this user)."),
                         (413, "Body larger than the limit (1 MiB)."),
                         (422, "Validation failed; `errors` lists each field."),
                         (429, "Over a quota; `quota` and `limit` name it."))
}


def _operation_id(route: APIRoute) -> str:
    # Every route sets operation_id explicitly; this only covers one that forgets.
    return route.operation_id or route.name


def _version() -> str:
    try:
        return dist_version("meshyard")
    except PackageNotFoundError:
        return "0.0.0"


async def _call(fn: Any) -> None:
    result = fn()
    if inspect.isawaitable(result):
        await result


def create_app(settings: Settings | None = None, *, store: Store | None = None,
               runtime: Runtime | None = None) -> FastAPI:
    """Builds the API. The caller owns migrations (`meshyard serve` applies them first);
    without a `store`, one is opened on `settings.resolved_database_url`."""
    settings = settings or get_settings()
    owns_engine = store is None
    if store is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = Store(make_engine(settings.resolved_database_url))
    engine = store.engine

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is not None:
            await _call(runtime.start)
        try:
            yield
        finally:
            if runtime is not None:
                await _call(runtime.stop)
            if owns_engine:
                engine.dispose()

    app = FastAPI(title="meshyard", version=_version(), lifespan=lifespan,
                  summary="Topology-aware distributed training on Ray.",
                  generate_unique_id_function=_operation_id, docs_url=None, redoc_url=None)
    metrics = HttpMetrics()
    metrics.add_job_counts(store.job_counts_by_state)
    metrics.add_job_conditions(store.active_jobs)
    metrics.add_node_health(lambda: nodes.statuses(store, settings))
    metrics.add_goodput(lambda: [(j, job_data.job_goodput(j, store).ratio)
                                 for j in store.active_jobs()[:MAX_GOODPUT_SERIES]])
    pool_status = getattr(runtime, "pool_status", None)
    if callable(pool_status):
        metrics.add_warm_pool(pool_status)
    app.state.settings, app.state.store, app.state.engine = settings, store, engine
    app.state.http_metrics, app.state.runtime = metrics, runtime
    app.state.token_cache = TokenCache()
    app.state.cluster_shape = ClusterShape(store)
    app.state.stream_slots = StreamSlots(settings.max_streams_per_user)

    install_error_handlers(app)
    for module in (jobs, job_data, logs, stacks, cluster, nodes, plans, tokens, users,
                   packages):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    app.include_router(health.router)
    ui.install(app)  # the web dashboard (HTML pages + static files)
    if settings.api_docs:
        docs.install(app)
    # add_middleware puts each new one outermost: metrics see the 413s the limit produces,
    # and the Host check and proxy headers run before anything else.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       overrides={packages.PREFIX: settings.max_package_bytes})
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(HostCheckMiddleware, allowed=settings.host_allowed)
    # X-Forwarded-Proto / -For from trusted proxies only (TLS termination: request.url is
    # https, so the session cookie is Secure). uvicorn's own copy is off (api/server.py).
    app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxies or [])
    return app
