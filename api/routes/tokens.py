"""/v1/tokens: API tokens over the API. Admins manage anyone's; everyone else their own.

POST {"user"?, "role"?, "label"?} makes a token (and the user, for an admin naming a new one)
and answers it once; GET lists tokens (never the tokens themselves); DELETE revokes one, and
ends the dashboard sessions it opened. A token revoked here (and its sessions) stops working
on this server at once, on other replicas within seconds.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from api.deps import StoreDep, TokenCacheDep, UserDep
from api.errors import Conflict, Forbidden, NotFound
from api.responses import model_response
from api.schemas import TokenCreated, TokenInfo, TokenList
from orchestrator.admission.access import Role
from orchestrator.bounds.limits import INT32_MAX
from orchestrator.store.records import UserRecord
from orchestrator.store.users import MAX_LABEL, USER_NAME_RE

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])
TokenId = Annotated[int, Path(ge=1, le=INT32_MAX, description="Token id.")]
UserName = Annotated[str, Field(pattern=USER_NAME_RE.pattern)]


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: UserName | None = Field(default=None, description="Whose token (default: the "
                                  "caller); only admins name another user.")
    role: Role | None = Field(default=None, description="Admins only: the user's role (a new "
                              "user defaults to user; an existing one keeps theirs).")
    label: str = Field(default="", max_length=MAX_LABEL, pattern=r"^[^\x00-\x1f\x7f]*$",
                       description="A note to recognise the token by.")


def _target(caller: UserRecord, user: str | None) -> str:
    if user is None or user == caller.name:
        return caller.name
    if not caller.is_admin:
        raise Forbidden(f"only admins make tokens for other users; {caller.name} may make "
                        "tokens for themself (leave out `user`)")
    return user


@router.post("", operation_id="createToken", response_model=TokenCreated, status_code=201)
def create_token(body: TokenRequest, caller: UserDep, store: StoreDep) -> Response:
    name = _target(caller, body.user)
    if body.role is not None and not caller.is_admin and body.role != caller.role:
        raise Forbidden(f"only admins set roles; {caller.name} has the role {caller.role.value}")
    try:
        record, plain = store.issue_token(name, role=body.role, label=body.label)
    except ValueError as exc:  # the last admin demoted, a bad name
        raise Conflict(str(exc)) from None
    user = store.get_user(name)
    assert user is not None
    return model_response(TokenCreated(**TokenInfo.model_validate(record).model_dump(),
                                       token=plain, role=user.role.value), status_code=201)


@router.get("", operation_id="listTokens", response_model=TokenList)
def list_tokens(caller: UserDep, store: StoreDep,
                user: Annotated[str | None, Query(pattern=USER_NAME_RE.pattern,
                                                  description="Admins: only this user's.")]
                = None,
                include_revoked: bool = False,
                after: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 500) -> Response:
    if not caller.is_admin:
        if user not in (None, caller.name):
            raise Forbidden(f"only admins list other users' tokens; {caller.name} sees their own")
        user = caller.name
    found = store.list_tokens(user=user, include_revoked=include_revoked, after=after,
                              limit=limit)
    return model_response(TokenList(items=[TokenInfo.model_validate(t) for t in found]))


@router.delete("/{token_id}", operation_id="revokeToken", response_model=TokenInfo)
def revoke_token(token_id: TokenId, caller: UserDep, store: StoreDep,
                 cache: TokenCacheDep) -> Response:
    """Another user's token is 404 for non-admins, like a token that does not exist."""
    done = store.revoke_token(token_id, owner=None if caller.is_admin else caller.name)
    if done is None:
        raise NotFound(f"token {token_id} not found")
    record, digest = done
    cache.forget_digest(digest)
    return model_response(TokenInfo.model_validate(record))
