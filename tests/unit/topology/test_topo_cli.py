"""`meshyard topo parse | labels | show` through typer's runner, and the real console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "topo"
runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None, stdin: str | None = None):
    return runner.invoke(app, list(args), env=env, input=stdin)


def test_parse_json_contract_dgx_a100():
    res = invoke("topo", "parse", str(FIX / "topo_dgx_a100_8gpu_nv12_12mlx5_numa_3_1_7_5.txt"),
                 "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert list(doc) == ["gpus", "nics", "links"]
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    assert doc["gpus"][2]["numa_node"] == 1 and doc["gpus"][2]["cpu_affinity"] == "16-31,144-159"
    assert [n["name"] for n in doc["nics"]] == [f"mlx5_{i}" for i in range(12)]
    assert doc["nics"][0]["nearest_gpus"] == [0, 1]
    assert {"gpu": 0, "type": "PXB"} in doc["nics"][0]["gpu_links"]
    pairs = [(x["a"], x["b"]) for x in doc["links"]]
    assert pairs == [(a, b) for a in range(8) for b in range(a + 1, 8)]
    assert {x["type"] for x in doc["links"]} == {"NV12"}


def test_parse_json_keeps_types_as_printed_and_reads_stdin():
    text = (FIX / "topo_p40_8gpu_pcie_pix_pxb_legacy_soc_legend.txt").read_text()
    res = invoke("topo", "parse", "-", "--json", stdin=text)
    doc = json.loads(res.output)
    assert {"a": 0, "b": 4, "type": "PXB"} in doc["links"]
    assert doc["nics"][0]["gpu_links"][0] == {"gpu": 0, "type": "SOC"}


def test_parse_nccl_xml():
    res = invoke("topo", "parse", str(FIX / "nccl_topo_azure_ndv5_h100.xml.txt"), "--json")
    doc = json.loads(res.output)
    assert len(doc["gpus"]) == 8 and doc["gpus"][3]["pci_bus_id"] == "0008:00:00.0"
    assert [n["name"] for n in doc["nics"]] == [f"NIC{i}" for i in range(8)]
    assert {"a": 0, "b": 4, "type": "SYS"} in doc["links"]


def test_parse_text_and_bad_input(tmp_path):
    res = invoke("topo", "parse", str(FIX / "topo_dgx1_v100_hybrid_cube_mesh_nv1_nv2.txt"))
    assert res.exit_code == 0
    assert res.output.splitlines()[0] == "8 GPUs  links NV1x8 NV2x8 SYSx12  NVLink groups {0-7}"
    bad = tmp_path / "bad.txt"
    bad.write_text("No devices were found\n")
    res = invoke("topo", "parse", str(bad), "--json")
    assert res.exit_code == 2 and "no `nvidia-smi topo -m` matrix found" in res.output


def test_labels_from_env_flags_and_file(tmp_path):
    f = tmp_path / "labels"
    f.write_text('cloud.google.com/gce-topology-block="b-1"\napp="web"\n')
    res = invoke("topo", "labels", "--no-discover", "--labels-file", str(f),
                 "--label", "nvidia.com/gpu.clique=6f1e.32766",
                 env={"MESHYARD_NODE_LABELS": "topology.k8s.aws/network-node-layer-3=nn-3"})
    assert res.exit_code == 0, res.output
    assert res.output.strip() == "nvlink_domain=6f1e.32766,block=b-1,leaf=nn-3"
    res = invoke("topo", "labels", "--no-discover", "--node-name", "dgx-b2", "--label",
                 "leaf=leaf-b", env={"MESHYARD_NODE_LABELS": ""})
    assert res.output.strip() == "meshyard.io/node=dgx-b2,leaf=leaf-b"
    res = invoke("topo", "labels", "--no-discover", "--label", "oops")
    assert res.exit_code == 2 and "is not key=value" in res.output


def test_labels_with_discovery_on_this_machine():
    res = invoke("topo", "labels", "--label", "meshyard.io/leaf=l0", "--json")
    assert res.exit_code == 0 and json.loads(res.output) == {"leaf": "l0"}  # no GPUs here


def test_show_cluster_tree():
    res = invoke("topo", "show", "--cluster", str(ROOT / "examples/clusters/mixed_fragmented.yaml"))
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == ("cluster: 5 nodes, 40 GPUs (27 free); levels (coarse to fine): "
                        "spine > leaf")
    assert lines[1:4] == ["spine spine-0", "  leaf leaf-a", "    dgx-h1: free 2/8, busy 0-5"]
    assert "    dgx1: free 4/8, busy 4-7" in lines
    assert "      8 GPUs  links NODEx8 PIXx4 SYSx16  NVLink groups none" in lines


def test_show_json_and_errors(tmp_path):
    res = invoke("topo", "show", "--cluster", str(ROOT / "examples/clusters/pcie_boxes.yaml"),
                 "--json")
    doc = json.loads(res.output)
    assert [n["name"] for n in doc["nodes"]] == ["pcie-1", "pcie-2", "p40-box"]
    bad = tmp_path / "c.yaml"
    bad.write_text("levels: [leaf]\nnodes: [{name: a, gpus: 8}]\n")
    res = invoke("topo", "show", "--cluster", str(bad))
    assert res.exit_code == 2 and "labels lack level(s) ['leaf']" in res.output


def test_show_local_node():
    res = invoke("topo", "show")
    assert res.exit_code == 0 and "0 GPUs" in res.output


@pytest.mark.parametrize("sample", ["topo_gb200_4gpu_nv18_8nics_multi_numa_affinity.txt"])
def test_console_script_parse_json(sample):
    exe = Path(sys.executable).parent / "meshyard"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from api.cli import main; main()"]
    out = subprocess.run([*cmd, "topo", "parse", str(FIX / sample), "--json"],
                         capture_output=True, text=True, check=True, timeout=120)
    doc = json.loads(out.stdout)
    assert [g["gpu_numa_id"] for g in doc["gpus"]] == [2, 10, 18, 26]
    assert [n["name"] for n in doc["nics"]][-1] == "mlx5_7"
    assert len(doc["links"]) == 6
