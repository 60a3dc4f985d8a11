"""/v1/nodes: the node health ledger. Anyone signed in reads it; admins cordon and uncordon.

A cordon an admin sets lasts `MESHYARD_NODE_CORDON_S` unless `permanent`; uncordon makes the
node healthy and stops its earlier evidence from counting as suspicion (it stays as history).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Response

from api.deps import AdminDep, SettingsDep, StoreDep, UserDep
from api.errors import NotFound
from api.responses import model_response
from api.schemas import CordonBody, NodeHealthList, NodeHealthOut
from api.store_views import statuses
from orchestrator.nodes.health_policy import NodeStatus, admin_cordon, admin_uncordon
from orchestrator.settings import Settings
from orchestrator.spec import PRINTABLE_RE
from orchestrator.store.repo import Store

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])
NodeName = Annotated[str, Path(max_length=200, pattern=PRINTABLE_RE,
                               description="Node name (GET /v1/nodes lists them).")]


def _dt(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def _out(s: NodeStatus) -> NodeHealthOut:
    return NodeHealthOut(name=s.name, node_id=s.node_id, alive=s.alive, state=s.state.value,
                         reason=s.reason, since=_dt(s.since), until=_dt(s.until),
                         permanent=s.permanent, cordoned_gpus=list(s.cordoned_gpus),
                         diagnosis_ids=list(s.diagnosis_ids),
                         evidence=[e.to_dict() for e in s.evidence])


def _one(store: Store, settings: Settings, name: str) -> NodeHealthOut:
    found = next((s for s in statuses(store, settings) if s.name == name), None)
    if found is None:
        raise NotFound(f"no node named {name!r}; GET /v1/nodes lists the nodes")
    return _out(found)


def _known(store: Store, name: str) -> str | None:
    node = next((n for n in store.list_nodes() if n.name == name), None)
    if node is None and store.get_node_health(name) is None:
        raise NotFound(f"no node named {name!r}; GET /v1/nodes lists the nodes")
    return node.node_id if node is not None else None


@router.get("", operation_id="listNodes", response_model=NodeHealthList)
def list_nodes(user: UserDep, store: StoreDep, settings: SettingsDep) -> Response:
    return model_response(NodeHealthList(items=[_out(s) for s in statuses(store, settings)]))


@router.get("/{name}", operation_id="getNode", response_model=NodeHealthOut)
def get_node(name: NodeName, user: UserDep, store: StoreDep, settings: SettingsDep) -> Response:
    return model_response(_one(store, settings, name))


@router.post("/{name}/cordon", operation_id="cordonNode", response_model=NodeHealthOut)
def cordon_node(name: NodeName, body: CordonBody, admin: AdminDep, store: StoreDep,
                settings: SettingsDep) -> Response:
    node_id = _known(store, name)
    policy = settings.health_policy()
    store.update_node_health(name, lambda h: admin_cordon(
        h, node=name, reason=body.reason, now=time.time(), permanent=body.permanent,
        policy=policy, by=admin.name), node_id=node_id)
    return model_response(_one(store, settings, name))


@router.post("/{name}/uncordon", operation_id="uncordonNode", response_model=NodeHealthOut)
def uncordon_node(name: NodeName, body: CordonBody, admin: AdminDep, store: StoreDep,
                  settings: SettingsDep) -> Response:
    node_id = _known(store, name)
    store.update_node_health(name, lambda h: admin_uncordon(
        h, node=name, reason=body.reason, now=time.time(), by=admin.name), node_id=node_id)
    return model_response(_one(store, settings, name))
