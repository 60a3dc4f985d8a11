"""/v1/cluster: the nodes the control plane knows, and their topology."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import RuntimeDep, SettingsDep, StoreDep, UserDep
from api.params import SinceQuery, text_query
from api.responses import model_response
from api.schemas import (
    Cluster,
    Isolation,
    Node,
    NodeTopology,
    NodeUsageList,
    NodeUsagePoint,
    Topology,
)
from api.state import RuntimeHooks
from orchestrator.isolation.modes import TRUSTED_WARNING, IsolationMode
from orchestrator.settings import Settings

router = APIRouter(prefix="/v1/cluster", tags=["cluster"])


@router.get("", operation_id="getCluster", response_model=Cluster)
def get_cluster(user: UserDep, store: StoreDep, settings: SettingsDep,
                runtime: RuntimeDep) -> Response:
    nodes = store.list_nodes()
    alive = [n for n in nodes if n.alive]
    return model_response(Cluster(nodes=[Node.model_validate(n) for n in nodes],
                                  total_gpus=sum(n.gpus for n in alive),
                                  total_cpus=sum(n.cpus for n in alive),
                                  isolation=_isolation(settings, runtime)))


def _isolation(settings: Settings, runtime: RuntimeHooks | None) -> Isolation | None:
    if runtime is None:
        return None
    if settings.isolation is IsolationMode.TRUSTED:
        return Isolation(mode="trusted", confined=False, detail=TRUSTED_WARNING)
    check = runtime.isolation
    if check is None:
        return Isolation(mode="isolated", confined=False, detail="not checked yet")
    return Isolation(mode="isolated", confined=check.ok, detail=check.describe())


@router.get("/topology", operation_id="getClusterTopology", response_model=Topology)
def get_topology(user: UserDep, store: StoreDep) -> Response:
    return model_response(Topology(nodes=[
        NodeTopology(name=n.name, node_id=n.node_id, topology=n.topology)
        for n in store.list_nodes()]))


@router.get("/usage", operation_id="listNodeUsage", response_model=NodeUsageList)
def list_node_usage(user: UserDep, store: StoreDep, since: SinceQuery = None,
                    node: Annotated[str | None, text_query("Only this node.")] = None,
                    limit: Annotated[int, Query(ge=1, le=20_000)] = 5000) -> Response:
    """Every node's utilisation samples (CPU, memory, GPUs), oldest first."""
    points = store.list_node_usage(since=since, node=node, limit=limit)
    return model_response(NodeUsageList(items=[NodeUsagePoint.model_validate(p)
                                               for p in points]))
