"""/v1/users: roles and quotas. Admins change them; a user may read their own quota.

PUT /v1/users/{name}/quota replaces the user's limits: a limit left out (or null) falls back
to the server's default (`MESHYARD_DEFAULT_MAX_*`; admins: unlimited).
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from api.admission import user_quota
from api.deps import AdminDep, SettingsDep, StoreDep, UserDep
from api.errors import Conflict, Forbidden, NotFound
from api.responses import model_response
from api.schemas import QuotaInfo, UserInfo, UserList
from orchestrator.admission.access import Role
from orchestrator.admission.quotas import Quota
from orchestrator.bounds.limits import INT32_MAX, MAX_WORLD_SIZE
from orchestrator.store.records import UserRecord
from orchestrator.store.repo import Store
from orchestrator.store.users import USER_NAME_RE

router = APIRouter(prefix="/v1/users", tags=["users"])
UserName = Annotated[str, Path(pattern=USER_NAME_RE.pattern, description="User name.")]


class RoleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role


class QuotaBody(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_queued_jobs: int | None = Field(default=None, ge=0, le=INT32_MAX)
    max_running_gpus: int | None = Field(default=None, ge=0, le=MAX_WORLD_SIZE)
    max_running_cpus: float | None = Field(default=None, ge=0, le=1e7)
    max_priority: int | None = Field(default=None, ge=-1000, le=1000)


def _user(store: Store, name: str) -> UserRecord:
    user = store.get_user(name)
    if user is None:
        raise NotFound(f"no user named {name!r}")
    return user


def _quota_info(store: Store, user: UserRecord, settings: SettingsDep) -> QuotaInfo:
    explicit = store.get_quota(user.name) or Quota()
    return QuotaInfo(user=user.name, **asdict(user_quota(store, user, settings)),
                     explicit=[f.name for f in fields(Quota)
                               if getattr(explicit, f.name) is not None])


@router.get("", operation_id="listUsers", response_model=UserList)
def list_users(admin: AdminDep, store: StoreDep) -> Response:
    return model_response(UserList(items=[UserInfo(name=u.name, role=u.role.value,
                                                   created_at=u.created_at)
                                          for u in store.list_users()]))


@router.patch("/{name}", operation_id="setUserRole", response_model=UserInfo)
def set_role(name: UserName, body: RoleBody, admin: AdminDep, store: StoreDep) -> Response:
    _user(store, name)
    try:
        user = store.set_role(name, body.role)
    except ValueError as exc:  # the last admin
        raise Conflict(str(exc)) from None
    return model_response(UserInfo(name=user.name, role=user.role.value,
                                   created_at=user.created_at))


@router.get("/{name}/quota", operation_id="getUserQuota", response_model=QuotaInfo)
def get_quota(name: UserName, caller: UserDep, store: StoreDep,
              settings: SettingsDep) -> Response:
    if not caller.is_admin and name != caller.name:
        raise Forbidden(f"only admins read other users' quotas; {caller.name} may read their own")
    return model_response(_quota_info(store, _user(store, name), settings))


@router.put("/{name}/quota", operation_id="setUserQuota", response_model=QuotaInfo)
def put_quota(name: UserName, body: QuotaBody, admin: AdminDep, store: StoreDep,
              settings: SettingsDep) -> Response:
    user = _user(store, name)
    store.set_quota(name, Quota(**body.model_dump()))
    return model_response(_quota_info(store, user, settings))
