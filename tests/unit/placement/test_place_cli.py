"""`meshyard place` on declared cluster files (the real CLI app, in process)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from api.cli import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "clusters"
runner = CliRunner()

TWO_NODES = """
levels: [leaf]
nodes:
  - {name: node-a, gpus: 8, intra_node: nvswitch, labels: {leaf: l0}}
  - {name: node-b, gpus: 8, intra_node: nvswitch, labels: {leaf: l0}}
  - {name: node-c, gpus: 8, intra_node: nvswitch, labels: {leaf: l0}, busy_gpus: [6, 7]}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_place_json_contract(tmp_path: Path) -> None:
    res = runner.invoke(app, ["place", "--cluster", str(_write(tmp_path, TWO_NODES)), "--tp", "8",
                              "--dp-replicate", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ranks"][0] == {"rank": 0, "node": "node-a", "node_key": "node-a", "gpu": 0,
                               "coords": {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "ep": 0,
                                          "cp": 0, "tp": 0}}
    assert [(r["node"], r["gpu"]) for r in out["ranks"][8:10]] == [("node-b", 0), ("node-b", 1)]
    dims = {d["dimension"]: d for d in out["estimate"]["dimensions"]}
    assert dims["tp"]["bottleneck"] == "NV18" and out["estimate"]["total_s"] > 0


FRAGMENTED = """
levels: [leaf]
defaults: {gpus: 8, intra_node: nvswitch, labels: {leaf: l0}}
nodes:
  - {name: node-a, busy_gpus: [0, 1, 2]}
  - {name: node-b, busy_gpus: [0, 1, 2]}
  - {name: node-c, busy_gpus: [6, 7]}
  - {name: node-d, busy_gpus: [0, 1]}
"""


def test_place_failure_exits_2_with_reason(tmp_path: Path) -> None:
    path = str(_write(tmp_path, FRAGMENTED))  # 22 GPUs free, at most 6 in one node
    res = runner.invoke(app, ["place", "--cluster", path, "--tp", "8", "--dp-replicate", "2",
                              "--json"])
    assert res.exit_code == 2
    err = json.loads(res.output)["error"]
    assert err["reason"] == "FRAGMENTED"
    assert "each of the 2 TP groups needs 8 GPUs inside one NVLink domain" in err["message"]
    assert "the largest free NVLink domain has 6, on node-c" in err["message"]
    res = runner.invoke(app, ["place", "--cluster", path, "--tp", "8", "--dp-replicate", "2",
                              "--preferred", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["relaxed"] is True
    res = runner.invoke(app, ["place", "--cluster", path, "--tp", "16", "--json"])
    assert res.exit_code == 2
    assert json.loads(res.output)["error"]["reason"] == "TP_DOMAIN_TOO_SMALL"


def test_place_bad_cluster_file(tmp_path: Path) -> None:
    res = runner.invoke(app, ["place", "--cluster", str(_write(tmp_path, "levels: 3\n")), "--json"])
    assert res.exit_code == 2
    assert json.loads(res.output)["error"]["reason"] == "INVALID_CLUSTER"


def test_place_example_clusters_text_output() -> None:
    res = runner.invoke(app, ["place", "--cluster", str(EXAMPLES / "dgx_h100_two_leaves.yaml"),
                              "--tp", "8", "--pp", "2", "--dp-replicate", "2"])
    assert res.exit_code == 0, res.output
    assert "level: leaf" in res.output and "bottleneck NV18" in res.output
    res = runner.invoke(app, ["place", "--cluster", str(EXAMPLES / "pcie_boxes.yaml"), "--tp",
                              "2", "--tp-within", "node", "--json"])
    assert res.exit_code == 0, res.output
