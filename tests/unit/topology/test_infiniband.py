"""sysfs InfiniBand on a fake tree (formats from the shared sample) and ibstat text."""

from pathlib import Path

import pytest

from orchestrator.topology.infiniband import (
    apply_ib_ports,
    parse_coded,
    parse_ibstat,
    parse_rate,
    read_ib_ports,
)
from orchestrator.topology.nvidia_smi import parse_topo_matrix

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "topo"


def make_port(root: Path, dev: str, port: int, **files: str) -> None:
    d = root / dev / "ports" / str(port)
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")


@pytest.fixture
def sysfs(tmp_path):
    make_port(tmp_path, "mlx5_0", 1, state="4: ACTIVE", phys_state="5: LinkUp",
              rate="400 Gb/sec (4X NDR)", link_layer="InfiniBand")
    make_port(tmp_path, "mlx5_1", 1, state="1: DOWN", phys_state="3: Disabled",
              rate="10 Gb/sec (4X SDR)", link_layer="InfiniBand")
    make_port(tmp_path, "mlx5_bond_0", 1, state="4: ACTIVE", phys_state="5: LinkUp",
              rate="200 Gb/sec (4X HDR)", link_layer="Ethernet")
    make_port(tmp_path, "mlx4_0", 1, state="1: DOWN", rate="2.5 Gb/sec (1X)")
    make_port(tmp_path, "mlx4_0", 2, state="4: ACTIVE", rate="100 Gb/sec (2X NDR)",
              link_layer="InfiniBand")
    return tmp_path


def test_read_fake_sysfs(sysfs):
    ports = {(p.device, p.port): p for p in read_ib_ports(sysfs)}
    assert set(ports) == {("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_bond_0", 1), ("mlx4_0", 1),
                          ("mlx4_0", 2)}
    p = ports[("mlx5_0", 1)]
    assert (p.state, p.phys_state, p.rate_gbps, p.rate_text, p.link_layer, p.active) == (
        "ACTIVE", "LinkUp", 400.0, "4X NDR", "InfiniBand", True)
    assert ports[("mlx5_1", 1)].active is False
    assert ports[("mlx4_0", 1)].rate_gbps == 2.5 and ports[("mlx4_0", 1)].link_layer is None
    assert ports[("mlx5_bond_0", 1)].link_layer == "Ethernet"


def test_missing_root_is_empty(tmp_path):
    assert read_ib_ports(tmp_path / "nope") == ()
    (tmp_path / "weird").mkdir()  # a device dir without ports/
    assert read_ib_ports(tmp_path) == ()


def test_apply_to_topo_m_nics(sysfs):
    topo = parse_topo_matrix((FIX / "topo_a10_4gpu_pcie_all_sys_2nics.txt").read_text())
    out = apply_ib_ports(topo, read_ib_ports(sysfs))
    by = {n.name: n for n in out.nics}
    assert [n.name for n in out.nics] == ["mlx5_0", "mlx5_1", "mlx4_0", "mlx5_bond_0"]
    assert (by["mlx5_0"].rate_gbps, by["mlx5_0"].state, by["mlx5_0"].index) == (400.0, "ACTIVE", 0)
    assert by["mlx5_1"].state == "DOWN"
    assert (by["mlx4_0"].rate_gbps, by["mlx4_0"].state) == (100.0, "ACTIVE")  # best port: 2
    assert out.gpu_nic_links[(0, "mlx5_0")] == "SYS" and out.link(0, 1) == "SYS"


def test_parsers():
    assert parse_coded("4: ACTIVE") == "ACTIVE" and parse_coded("5: LinkUp") == "LinkUp"
    assert parse_coded("") is None and parse_coded("ACTIVE") == "ACTIVE"
    assert parse_rate("100 Gb/sec (2X NDR)") == (100.0, "2X NDR")
    assert parse_rate("garbage") == (None, None)


def test_ibstat_block_from_sample():
    text = (FIX / "sysfs_ib_and_ibstat_formats.txt").read_text()
    ports = parse_ibstat(text)
    assert [(p.device, p.port, p.state, p.phys_state, p.rate_gbps) for p in ports] == [
        ("mlx4_0", 1, "DOWN", "Disabled", 10.0), ("mlx4_0", 2, "ACTIVE", "LinkUp", 56.0)]
    assert ports[0].link_layer == "InfiniBand"
