"""Expert / context parallel in placement: their groups stay inside NVLink domains, the cost
model's all-to-all and ring send/recv rows, and `meshyard place --ep --cp`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from orchestrator.mesh import MeshShape
from orchestrator.placement.blocks import block_sizes
from orchestrator.placement.cost import ModelDims, call_seconds, communication_signature
from orchestrator.placement.links import Link
from orchestrator.placement.solver import Placement, solve
from tests.unit.placement.clusters import cluster, nvswitch

# Two NVSwitch nodes with 6 free GPUs each: an 8-rank job must span both.
SIX_AND_SIX = [("node-a", nvswitch(), {"leaf": "l0"}, [6, 7]),
               ("node-b", nvswitch(), {"leaf": "l0"}, [6, 7])]


def _nodes(p: Placement, ranks: tuple[int, ...]) -> set[str]:
    return {p.ranks[r].node for r in ranks}


def test_ep_groups_each_stay_inside_one_nvlink_domain() -> None:
    c = cluster(SIX_AND_SIX)
    p = solve(c, MeshShape(dp_shard=2, ep=4))
    assert isinstance(p, Placement), p
    assert p.mesh.groups("ep") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    for group in p.mesh.groups("ep"):
        assert len(_nodes(p, group)) == 1, [(p.ranks[r].node, p.ranks[r].gpu) for r in group]
    dims = {d.dimension: d for d in p.estimate.dimensions}
    assert dims["ep"].bottleneck == "NV18"  # the all-to-all never crosses InfiniBand
    assert dims["dp_shard"].bottleneck.startswith("IB")
    # The same 8 ranks without EP pack the first node full (6 + 2): it is the EP block that
    # keeps 4 + 4 here, not the cluster's shape.
    plain = solve(c, MeshShape(dp_shard=2, dp_replicate=4))
    assert isinstance(plain, Placement)
    assert sum(r.node == "node-a" for r in plain.ranks) == 6


def test_cp_ring_inside_a_node_before_ep_and_dp() -> None:
    c = cluster(SIX_AND_SIX)
    p = solve(c, MeshShape(dp_shard=2, ep=2, cp=2))
    assert isinstance(p, Placement), p
    for dim in ("cp", "ep"):
        for group in p.mesh.groups(dim):
            assert len(_nodes(p, group)) == 1, dim
    assert block_sizes(MeshShape(dp_shard=2, ep=2, cp=2, tp=2)) == [1, 2, 4]


def test_signature_has_all_to_all_and_ring_rows() -> None:
    d = ModelDims(n_layers=4, d_model=1024, seq_len=8192, micro_batch_size=2, moe_experts=8,
                  moe_top_k=2, moe_capacity_factor=1.0)
    rows = {(r.dimension, r.primitive): r for r in
            communication_signature(MeshShape(dp_shard=2, ep=4, cp=2), d)}
    act = 2 * 8192 * 1024 * 2
    a2a = rows[("ep", "all_to_all")]
    assert a2a.participants == 4 and a2a.calls_per_step == 4 * 4
    assert a2a.bytes_per_call == act // 2 * 2  # this rank's half sequence, top-2, capacity 1
    ring = rows[("cp", "send_recv")]
    assert ring.participants == 2 and ring.calls_per_step == 3 * 1 * 4
    assert ring.bytes_per_call == 2 * act // 2  # K and V of one sequence shard
    link = Link("NV18", 450.0, 2e-6)
    assert call_seconds("all_to_all", n=4, nbytes=1 << 30, link=link) == \
        pytest.approx(3 / 4 * (1 << 30) / 450e9 + 3 * 2e-6, rel=1e-12)


def test_place_cli_takes_ep_and_cp(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("levels: [leaf]\nnodes:\n"
                    "  - {name: node-a, gpus: 8, intra_node: nvswitch, labels: {leaf: l0}}\n")
    res = CliRunner().invoke(app, ["place", "--cluster", str(path), "--ep", "2", "--cp", "2",
                                   "--dp-shard", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ranks"][3]["coords"] == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "ep": 1,
                                         "cp": 1, "tp": 0}
    dims = {d["dimension"] for d in out["estimate"]["dimensions"]}
    assert {"ep", "cp", "dp_shard"} <= dims
    table = CliRunner().invoke(app, ["place", "--cluster", str(path), "--ep", "2"])
    assert table.exit_code == 0 and " ep  cp " in table.output
    bad = CliRunner().invoke(app, ["place", "--cluster", str(path), "--ep", "0"])
    assert bad.exit_code != 0
