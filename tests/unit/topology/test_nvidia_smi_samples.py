"""Every shared `nvidia-smi topo -m` sample, parsed, with exact assertions."""

from pathlib import Path

import pytest

from orchestrator.topology.nvidia_smi import parse_topo_matrix

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "topo"


def load(name: str):
    return parse_topo_matrix((FIX / name).read_text())


def test_every_sample_is_covered_here():
    names = {p.name for p in FIX.glob("topo_*.txt")}
    assert names == set(SAMPLES), "a sample was added without a table entry below"


# file -> (gpu count, NIC names in column order, a few exact (a, b, link) checks)
SAMPLES = {
    "topo_2x1080ti_pcie_phb_numa_na.txt": (2, [], [(0, 1, "PHB")]),
    "topo_a10_4gpu_pcie_all_sys_2nics.txt": (4, ["mlx5_0", "mlx5_1"], [(0, 3, "SYS")]),
    "topo_dgx1_v100_hybrid_cube_mesh_nv1_nv2.txt": (
        8, ["mlx5_0"], [(0, 1, "NV1"), (0, 3, "NV2"), (0, 5, "SYS"), (3, 7, "NV1"),
                        (4, 7, "NV2"), (2, 6, "NV1")]),
    "topo_dgx_a100_8gpu_nv12_12mlx5_numa_3_1_7_5.txt": (
        8, [f"mlx5_{i}" for i in range(12)], [(0, 7, "NV12"), (3, 4, "NV12")]),
    "topo_gb200_4gpu_nv18_8nics_multi_numa_affinity.txt": (
        4, [f"mlx5_{i}" for i in range(8)], [(0, 3, "NV18"), (1, 2, "NV18")]),
    "topo_h100_4gpu_nv6_4nics_sparse_cpu_affinity.txt": (
        4, ["NIC0", "NIC1", "NIC2", "NIC3"], [(0, 1, "NV6"), (2, 3, "NV6")]),
    "topo_h100_8gpu_nv18_no_nics.txt": (8, [], [(0, 7, "NV18"), (3, 4, "NV18")]),
    "topo_p40_8gpu_pcie_pix_pxb_legacy_soc_legend.txt": (
        8, ["mlx5_0"], [(0, 3, "PIX"), (3, 4, "PXB"), (4, 7, "PIX")]),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_counts_nics_and_links(name):
    n_gpus, nics, checks = SAMPLES[name]
    t = load(name)
    assert t.gpu_indices == tuple(range(n_gpus))
    assert [n.name for n in t.nics] == nics
    assert len(t.links) == n_gpus * (n_gpus - 1) // 2  # one per unordered pair
    for a, b, link in checks:
        assert t.link(a, b) == link and t.link(b, a) == link


def test_1080ti_numa_na_and_affinity():
    t = load("topo_2x1080ti_pcie_phb_numa_na.txt")
    assert [g.cpu_affinity for g in t.gpus] == ["0-11", "0-11"]
    assert [g.numa_node for g in t.gpus] == [None, None]
    assert t.gpus[0].numa_affinity is None and t.gpus[0].cpus == tuple(range(12))


def test_a10_all_sys_nic_legend_and_gpu_numa_na():
    t = load("topo_a10_4gpu_pcie_all_sys_2nics.txt")
    assert set(t.links.values()) == {"SYS"}
    assert [n.index for n in t.nics] == [0, 1]
    assert t.gpu_nic_links[(2, "mlx5_1")] == "SYS"
    assert all(n.nearest_gpus == () for n in t.nics)  # SYS is not "near"
    assert [(g.cpu_affinity, g.numa_node, g.gpu_numa_id) for g in t.gpus] == [("0-127", 0, None)] * 4


def test_dgx1_hybrid_cube_mesh_links_and_nic_by_device_name():
    t = load("topo_dgx1_v100_hybrid_cube_mesh_nv1_nv2.txt")
    nv = {p: link for p, link in t.links.items() if link.startswith("NV")}
    assert len(nv) == 16  # each V100 has 4 NVLink neighbours (two of them doubled)
    assert sorted(p for p, v in nv.items() if v == "NV2") == [
        (0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)]
    assert {t.link(0, b) for b in (1, 2, 3, 4)} == {"NV1", "NV2"}
    assert t.nvlink_components() == [frozenset(range(8))]
    nic = t.nics[0]
    assert nic.index is None and nic.nearest_gpus == (2, 3)
    assert t.gpu_nic_links[(0, "mlx5_0")] == "NODE" and t.gpu_nic_links[(4, "mlx5_0")] == "SYS"
    assert t.nearest_nic(3) == "mlx5_0"
    assert t.gpus[4].cpu_affinity == "12-23,36-47" and t.gpus[4].numa_node is None


def test_dgx_a100_tabs_twelve_nics_numa():
    t = load("topo_dgx_a100_8gpu_nv12_12mlx5_numa_3_1_7_5.txt")
    assert [g.numa_node for g in t.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert t.gpus[6].cpu_affinity == "80-95,208-223"
    by = {n.name: n.nearest_gpus for n in t.nics}
    assert by["mlx5_0"] == (0, 1) and by["mlx5_9"] == (6, 7)
    assert by["mlx5_4"] == () and by["mlx5_11"] == ()  # storage NICs: SYS to every GPU
    assert t.gpu_nic_links[(4, "mlx5_6")] == "PXB"
    assert t.nearest_nic(5) in ("mlx5_6", "mlx5_7")


def test_gb200_numa_lists_and_gpu_numa_id():
    t = load("topo_gb200_4gpu_nv18_8nics_multi_numa_affinity.txt")
    assert [g.numa_affinity for g in t.gpus] == ["0,3-9,11-17"] * 2 + ["1,19-25,27-33"] * 2
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]
    assert [g.gpu_numa_id for g in t.gpus] == [2, 10, 18, 26]
    assert [g.cpu_affinity for g in t.gpus] == ["0-71", "0-71", "72-143", "72-143"]
    assert [n.index for n in t.nics] == list(range(8))  # legend's last line has no newline


def test_h100_nv6_sparse_affinity_without_legend():
    t = load("topo_h100_4gpu_nv6_4nics_sparse_cpu_affinity.txt")
    assert [g.cpu_affinity for g in t.gpus] == ["6,14,22,30", "4,12,20,28", "7,15,23,31",
                                                "5,13,21,29"]
    assert [g.numa_node for g in t.gpus] == [3, 1, 7, 5]
    assert [n.nearest_gpus for n in t.nics] == [(0,), (1,), (2,), (3,)]
    assert [t.nearest_nic(g) for g in range(4)] == ["NIC0", "NIC1", "NIC2", "NIC3"]


def test_h100_no_nics():
    t = load("topo_h100_8gpu_nv18_no_nics.txt")
    assert t.nics == () and dict(t.gpu_nic_links) == {}
    assert [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    assert t.nearest_nic(0) is None


def test_p40_legacy_soc():
    t = load("topo_p40_8gpu_pcie_pix_pxb_legacy_soc_legend.txt")
    assert {t.gpu_nic_links[(g, "mlx5_0")] for g in range(8)} == {"SOC"}
    assert t.nics[0].nearest_gpus == ()
    assert t.nvlink_components() == [frozenset({g}) for g in range(8)]
    assert t.gpus[7].cpu_affinity == "0-13" and t.gpus[7].numa_affinity is None
