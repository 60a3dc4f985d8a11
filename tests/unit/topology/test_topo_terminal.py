"""`nvidia-smi topo -m` captured from a terminal or copied from a web page parses exactly like
the plain output (tests/fixtures/topo_terminal/), through the parser, `meshyard topo parse`
and declared cluster files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from orchestrator.topology.declared import load_cluster_file
from orchestrator.topology.nvidia_smi import parse_topo_matrix
from orchestrator.topology.serialize import node_topology_to_dict

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "topo_terminal"
TWINS = [("topo_h100_8gpu_4nic_plain.txt", "topo_h100_8gpu_4nic_tty.txt"),
         ("topo_2gpu_phb_plain.txt", "topo_2gpu_phb_web_residue.txt"),
         ("topo_2gpu_nv12_2nic_plain.txt", "topo_2gpu_nv12_2nic_caret.txt")]
runner = CliRunner()


def _raw(name: str) -> str:
    return (FIX / name).read_bytes().decode()  # keep CR and ESC bytes as captured


def test_the_twins_carry_what_they_claim() -> None:
    assert "\t\x1b[4mGPU0" in _raw(TWINS[0][1]) and "\r\n" in _raw(TWINS[0][1])
    assert "\t[4mGPU0" in _raw(TWINS[1][1]) and "\x1b" not in _raw(TWINS[1][1])
    assert "\t^[[4mGPU0" in _raw(TWINS[2][1])


@pytest.mark.parametrize("plain,twin", TWINS)
def test_twin_parses_exactly_like_plain(plain: str, twin: str) -> None:
    a, b = parse_topo_matrix(_raw(plain)), parse_topo_matrix(_raw(twin))
    assert a == b
    assert node_topology_to_dict(a) == node_topology_to_dict(b)


def test_h100_facts() -> None:
    t = parse_topo_matrix(_raw("topo_h100_8gpu_4nic_tty.txt"))
    assert t.gpu_indices == tuple(range(8))
    assert set(t.links.values()) == {"NV18"}
    assert [(n.name, n.nearest_gpus) for n in t.nics] == [
        (f"mlx5_{j}", (2 * j, 2 * j + 1)) for j in range(4)]
    assert [g.cpu_affinity for g in t.gpus][3:5] == ["0-55,112-167", "56-111,168-223"]


@pytest.mark.parametrize("plain,twin", TWINS)
def test_cli_json_is_identical(plain: str, twin: str) -> None:
    a = runner.invoke(app, ["topo", "parse", str(FIX / plain), "--json"])
    b = runner.invoke(app, ["topo", "parse", str(FIX / twin), "--json"])
    c = runner.invoke(app, ["topo", "parse", "-", "--json"], input=_raw(twin))
    assert a.exit_code == b.exit_code == c.exit_code == 0, (a.output, b.output, c.output)
    assert json.loads(a.output) == json.loads(b.output) == json.loads(c.output)


def test_declared_cluster_with_terminal_captures() -> None:
    cluster = load_cluster_file(FIX / "cluster_tty_topo.yaml")
    h100, a100 = cluster.nodes
    assert h100.topology == parse_topo_matrix(_raw("topo_h100_8gpu_4nic_plain.txt"))
    assert a100.topology == parse_topo_matrix(_raw("topo_2gpu_nv12_2nic_plain.txt"))
    assert "\x1b" in _raw("cluster_tty_topo.yaml")  # raw ESC bytes, which YAML alone rejects
    res = runner.invoke(app, ["topo", "show", "--cluster", str(FIX / "cluster_tty_topo.yaml")])
    assert res.exit_code == 0, res.output
    assert "a100-b" in res.output and "NVLink groups {0-1}" in res.output
