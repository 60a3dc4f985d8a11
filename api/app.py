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
from typing import Any

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
    job_data,
    jobs,
    logs,
    nodes,
    packages,
    plans,
    probes,
    stacks,
    tokens,
    ui,
    users,
)
from api.schemas import Problem
from api.state import AppState, RuntimeHooks
from api.store_views import job_goodput, statuses
from api.streams import StreamSlots
from api.throttle import FailedLogins
from orchestrator.settings import Settings, get_settings
from orchestrator.store.db import make_engine
from orchestrator.store.repo import Store

# Goodput is computed per job at scrape time (three reads each): the first N active jobs.
MAX_GOODPUT_SERIES = 200


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": text,
             "content": {"application/problem+json": {}}}
    for status, text in ((401, "Missing or invalid bearer token."),
                         (403, "The caller's role or the deployment policy refuses it."),
                         (404, "Not found (or not visible to this user)."),
                         (413, "Body larger than the limit (1 MiB)."),
                         (422, "Validation failed; `errors` lists each field."),
                         (429, "Over a quota (`quota` and `limit` name it), or too many "
                               "failed logins from this address (Retry-After)."))
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
               runtime: RuntimeHooks | None = None) -> FastAPI:
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
    metrics = HttpMetrics(max_goodput_series=MAX_GOODPUT_SERIES)
    metrics.add_job_counts(store.job_counts_by_state)
    metrics.add_job_conditions(store.active_jobs)
    metrics.add_node_health(lambda: statuses(store, settings))
    metrics.add_goodput(lambda job: job_goodput(job, store).ratio)
    if runtime is not None:
        metrics.add_warm_pool(runtime.pool_status)
    app.state.meshyard = AppState(
        settings=settings, store=store, engine=engine, http_metrics=metrics, runtime=runtime,
        token_cache=TokenCache(),
        login_throttle=FailedLogins(max_failures=settings.login_failures_max,
                                    window_s=settings.login_failures_window_s,
                                    max_clients=settings.login_throttle_clients),
        cluster_shape=ClusterShape(store), stream_slots=StreamSlots(settings.max_streams_per_user))

    install_error_handlers(app)
    for module in (jobs, job_data, logs, stacks, cluster, nodes, plans, tokens, users,
                   packages):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    app.include_router(probes.router)
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
