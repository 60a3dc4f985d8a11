"""/v1/cluster: the nodes the control plane knows, and their topology."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.deps import StoreDep, UserDep
from api.responses import model_response
from api.schemas import Cluster, Node, NodeTopology, Topology

router = APIRouter(prefix="/v1/cluster", tags=["cluster"])


@router.get("", operation_id="getCluster", response_model=Cluster)
def get_cluster(user: UserDep, store: StoreDep) -> Response:
    nodes = store.list_nodes()
    alive = [n for n in nodes if n.alive]
    return model_response(Cluster(nodes=[Node.model_validate(n) for n in nodes],
                                  total_gpus=sum(n.gpus for n in alive),
                                  total_cpus=sum(n.cpus for n in alive)))


@router.get("/topology", operation_id="getClusterTopology", response_model=Topology)
def get_topology(user: UserDep, store: StoreDep) -> Response:
    return model_response(Topology(nodes=[
        NodeTopology(name=n.name, node_id=n.node_id, topology=n.topology)
        for n in store.list_nodes()]))
