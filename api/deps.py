"""FastAPI dependencies: the store, the settings, the caller, and lookup-or-404 for jobs.

Dependencies that touch the database are plain `def`: FastAPI runs them in its threadpool,
which is what the synchronous SQLAlchemy store needs. The trivial ones are `async def` so they
cost no threadpool hop.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from api.auth import authenticate
from api.errors import Forbidden, NotFound, PolicyRefused
from orchestrator.access import may_submit
from orchestrator.settings import Settings
from orchestrator.spec import PRINTABLE_RE
from orchestrator.store.records import JobRecord, UserRecord
from orchestrator.store.repo import Store


async def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]


async def current_user(request: Request, store: StoreDep) -> UserRecord:
    return await authenticate(request, store, request.app.state.token_cache)


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
