"""discover_local_node on this (GPU-less) machine, and with stand-in `nvidia-smi`
executables run for real as subprocesses; cluster_from_discovery on recorded results."""

from __future__ import annotations

import uuid
from pathlib import Path

from orchestrator.topology.discovery import (
    LocalDiscovery,
    cluster_from_discovery,
    discover_local_node,
)
from tests.unit.topology.test_nvml import FakeNvml, switch_node

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "topo"


def fake_smi(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return str(exe)


def test_this_machine_never_raises():
    d = discover_local_node()  # no nvidia-smi, no driver here
    assert "nvidia-smi" not in d.sources and "nvml" not in d.sources
    assert d.topology.gpus == () and d.hostname
    assert not any(e.startswith("nvml") for e in d.errors)  # no NVML library is not a fault
    assert LocalDiscovery.from_dict(d.to_dict()) == d


def test_fake_nvidia_smi_binary(tmp_path):
    sample = FIX / "topo_dgx_a100_8gpu_nv12_12mlx5_numa_3_1_7_5.txt"
    exe = fake_smi(tmp_path, f'[ "$1 $2" = "topo -m" ] || exit 3\ncat "{sample}"')
    d = discover_local_node(nvidia_smi=exe, nvml_module=None, ib_root=None, hostname="h1")
    assert d.sources == ("nvidia-smi",) and d.errors == ()
    assert len(d.topology.gpus) == 8 and d.topology.link(0, 5) == "NV12"
    assert len(d.topology.nics) == 12 and d.labels == {}


def test_failing_nvidia_smi_is_reported_not_raised(tmp_path):
    exe = fake_smi(tmp_path, "echo \"NVIDIA-SMI has failed because it couldn't communicate "
                             "with the NVIDIA driver.\"\nexit 9")
    d = discover_local_node(nvidia_smi=exe, nvml_module=None, ib_root=None)
    assert d.topology.gpus == ()
    assert d.errors == (f"nvidia-smi: {exe} topo -m exited 9: NVIDIA-SMI has failed "
                        "because it couldn't communicate with the NVIDIA driver.",)


def test_nvml_only_plus_infiniband(tmp_path):
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    cluster = uuid.uuid4()
    fake = FakeNvml(switch_node(4, fabric=(cluster.bytes, 9, 3)))
    d = discover_local_node(nvidia_smi=str(tmp_path / "missing-smi"), nvml_module=fake,
                            ib_root=str(tmp_path / "ib"))
    assert d.sources == ("nvml", "sysfs-ib") and d.errors == ()
    assert d.topology.link(0, 3) == "NV18"
    assert d.labels == {"nvlink_domain": f"{cluster}.9"}
    assert [(n.name, n.rate_gbps, n.state) for n in d.topology.nics] == [
        ("mlx5_0", 400.0, "ACTIVE")]


def test_cluster_from_discovery_labels_and_simulated_gpus():
    gpu_node = discover_local_node(nvidia_smi=None, nvml_module=FakeNvml(switch_node(4)),
                                   ib_root=None, hostname="gb1").to_dict()
    results = {"aaaa1111": {**gpu_node, "node_id": "aaaa1111"},
               "bbbb2222": {"node_id": "bbbb2222", "hostname": "sim", "topology": {"gpus": []}},
               "cccc3333": {"node_id": "cccc3333", "hostname": "sim", "topology": {"gpus": []}},
               "dead": {"node_id": "dead", "error": "no answer within 60s"}}
    ray_nodes = [
        {"NodeID": "aaaa1111", "Alive": True, "Resources": {"GPU": 4.0},
         "Labels": {"ray.io/node-id": "aaaa1111", "leaf": "l0",
                    "network.topology.nvidia.com/spine": "s0"}},
        {"NodeID": "bbbb2222", "Alive": True, "Resources": {"GPU": 2.0, "CPU": 2.0},
         "Labels": {"leaf": "l1", "spine": "s0", "meshyard.io/node": "sim-b"}},
        {"NodeID": "cccc3333", "Alive": True, "Resources": {"CPU": 1.0}, "Labels": {}},
        {"NodeID": "gone", "Alive": False, "Resources": {"GPU": 8.0}},
    ]
    c = cluster_from_discovery(results, ray_nodes)
    assert c.levels == ("leaf", "spine")
    assert [n.name for n in c.nodes] == ["gb1", "sim-b", "sim-cccc3333"]
    a, b, head = c.nodes
    assert a.topology.link(0, 1) == "NV18" and a.key == "aaaa1111" and dict(a.labels) == {
        "leaf": "l0", "spine": "s0"}
    assert b.free_gpus == (0, 1) and b.topology.link(0, 1) == "SYS"  # simulated GPUs
    assert head.topology.gpus == () and c.path(b) == ("s0", "l1")
