"""FastAPI dependencies: the store, the settings, the caller, and lookup-or-404 for jobs.

Dependencies that touch the database are plain `def`: FastAPI runs them in its threadpool,
which is what the synchronous SQLAlchemy store needs. The trivial ones are `async def` so they
cost no threadpool hop.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from api.admission import ClusterShape
from api.auth import TokenCache, authenticate
from api.errors import Forbidden, NotFound, PolicyRefused
from api.metrics import HttpMetrics
from api.state import AppState, RuntimeHooks
from api.streams import StreamSlots
from api.throttle import FailedLogins
from orchestrator.admission.access import may_submit
from orchestrator.settings import Settings
from orchestrator.spec import PRINTABLE_RE
from orchestrator.store.records import JobRecord, UserRecord
from orchestrator.store.repo import Store


def app_state(request: Request) -> AppState:
    """The app's typed state (api/state.py); every other dependency reads it."""
    state: AppState = request.app.state.meshyard
    return state


StateDep = Annotated[AppState, Depends(app_state)]


async def get_store(state: StateDep) -> Store:
    return state.store


async def get_app_settings(state: StateDep) -> Settings:
    return state.settings


async def get_runtime(state: StateDep) -> RuntimeHooks | None:
    return state.runtime


async def get_token_cache(state: StateDep) -> TokenCache:
    return state.token_cache


async def get_login_throttle(state: StateDep) -> FailedLogins:
    return state.login_throttle


async def get_cluster_shape(state: StateDep) -> ClusterShape:
    return state.cluster_shape


async def get_stream_slots(state: StateDep) -> StreamSlots:
    return state.stream_slots


async def get_http_metrics(state: StateDep) -> HttpMetrics:
    return state.http_metrics


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
RuntimeDep = Annotated[RuntimeHooks | None, Depends(get_runtime)]
TokenCacheDep = Annotated[TokenCache, Depends(get_token_cache)]
ThrottleDep = Annotated[FailedLogins, Depends(get_login_throttle)]
ClusterShapeDep = Annotated[ClusterShape, Depends(get_cluster_shape)]
StreamSlotsDep = Annotated[StreamSlots, Depends(get_stream_slots)]
HttpMetricsDep = Annotated[HttpMetrics, Depends(get_http_metrics)]


async def current_user(request: Request, store: StoreDep, cache: TokenCacheDep,
                       throttle: ThrottleDep) -> UserRecord:
    return await authenticate(request, store, cache, throttle)


UserDep = Annotated[UserRecord, Depends(current_user)]


async def job_writer(user: UserDep) -> UserRecord:
    """A caller whose role may submit and cancel jobs (admins and users; not viewers)."""
    denied = may_submit(user.role)
    if denied is not None:
        raise PolicyRefused([denied])
    return user


async def admin_user(user: UserDep) -> UserRecord:
    if not user.is_admin:
        raise Forbidden(f"only admins may do this; {user.name} has the role {user.role.value}")
    return user


WriterDep = Annotated[UserRecord, Depends(job_writer)]
AdminDep = Annotated[UserRecord, Depends(admin_user)]


def visible_job(job_id: Annotated[str, Path(max_length=100, pattern=PRINTABLE_RE,
                                            description="Job id.")],
                user: UserDep, store: StoreDep) -> JobRecord:
    """The job if the caller may see it. Other users' jobs are 404, not 403: a user learns
    nothing about jobs that are not theirs."""
    job = store.get_job(job_id, viewer=user)
    if job is None:
        raise NotFound(f"job {job_id!r} not found")
    return job


JobDep = Annotated[JobRecord, Depends(visible_job)]
