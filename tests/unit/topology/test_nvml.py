"""NVML reader against a fake module with pynvml's function names (no GPU here), and the
real pynvml failing cleanly without a driver."""

from __future__ import annotations

import ctypes
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.topology.nvidia_smi import parse_topo_matrix
from orchestrator.topology.nvml import (
    NvmlUnavailable,
    merge_nvml,
    normalize_bus_id,
    nvlink_links,
    read_nvml,
)

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "topo"


class FabricV(ctypes.Structure):  # same layout as pynvml.c_nvmlGpuFabricInfo_v2_t
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32)]


class FabricV1(ctypes.Structure):  # pynvml.c_nvmlGpuFabricInfo_t
    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint)]


class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """Each GPU: bus id, links {link: (remote bus id, remote type)}, fabric tuple or None."""

    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVMLError = FakeNVMLError
    c_nvmlGpuFabricInfoV_t = FabricV
    c_nvmlGpuFabricInfo_t = FabricV1

    def __init__(self, gpus, *, legacy_fabric=False):
        self.gpus = gpus
        self.calls: list[str] = []
        if legacy_fabric:  # an older binding without the versioned call
            self.c_nvmlGpuFabricInfoV_t = None

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:08d}"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self.gpus[h]["bus"].encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 * 2**30)

    def nvmlDeviceGetNumaNodeId(self, h):
        raise FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self.gpus[h]["links"]
        if link >= self.gpus[h].get("n_links", 18):
            raise FakeNVMLError("NVML_ERROR_INVALID_ARGUMENT")
        return 1 if link in links else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self.gpus[h]["links"][link][0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self.gpus[h]["links"][link][1]

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return 4

    def _fabric(self, h, ref):
        fab = self.gpus[h].get("fabric")
        if fab is None:
            raise FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")
        info = ref._obj
        raw, clique, state = fab
        info.clusterUuid[:] = list(raw)
        info.cliqueId, info.state, info.status = clique, state, 0
        return 0

    def nvmlDeviceGetGpuFabricInfoV(self, h, ref):
        self.calls.append("fabricV")
        return self._fabric(h, ref)

    def nvmlDeviceGetGpuFabricInfo(self, h, ref):
        self.calls.append("fabric")
        return self._fabric(h, ref)


def bus(i: int) -> str:
    return f"00000000:{0x10 + i:02X}:00.0"


def switch_node(n: int, *, fabric=None, n_links=18):
    return [{"bus": bus(i), "n_links": n_links, "fabric": fabric,
             "links": {k: (f"00000000:{0xA0 + k % 4:02X}:00.0", 2) for k in range(n_links)}}
            for i in range(n)]


def test_direct_links_count_bonds_like_topo_m():
    # DGX-1-like quad: 0-1 doubled, 0-2 single, 1-3 single, 2-3 doubled; link 5 of GPU 3 down.
    pairs = {0: [1, 1, 2], 1: [0, 0, 3], 2: [0, 3, 3], 3: [1, 2, 2]}
    gpus = [{"bus": bus(i), "n_links": 6,
             "links": {k: (bus(p), 0) for k, p in enumerate(peers)}} for i, peers in pairs.items()]
    fake = FakeNvml(gpus)
    read = read_nvml(fake)
    assert [len(g.nvlinks) for g in read] == [3, 3, 3, 3]
    assert read[0].pci_bus_id == "0000:10:00.0" and read[0].nvlinks[0].remote_type == "gpu"
    assert nvlink_links(read) == {(0, 1): "NV2", (0, 2): "NV1", (1, 3): "NV1", (2, 3): "NV2"}
    topo = merge_nvml(None, read)
    assert topo.link(0, 3) == "SYS" and topo.link(2, 3) == "NV2"
    assert fake.calls[0] == "init" and fake.calls[-1] == "shutdown"
    assert read[0].numa_node is None and read[0].memory_gb == 80.0
    assert read[0].fabric_state is None  # neither fabric call supported on this GPU


def test_nvswitch_gives_nv18_every_pair():
    read = read_nvml(FakeNvml(switch_node(8)))
    links = nvlink_links(read)
    assert len(links) == 28 and set(links.values()) == {"NV18"}
    assert {ln.remote_type for ln in read[3].nvlinks} == {"switch"}


def test_switch_links_without_remote_type_call():
    class OldDriver(FakeNvml):
        def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
            raise FakeNVMLError("NVML_ERROR_FUNCTION_NOT_FOUND")

    read = read_nvml(OldDriver(switch_node(4, n_links=12)))
    assert {ln.remote_type for g in read for ln in g.nvlinks} == {None}
    assert set(nvlink_links(read).values()) == {"NV12"} and len(nvlink_links(read)) == 6


def test_gb200_fabric_clique_names_the_nvlink_domain():
    cluster = uuid.UUID("6f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    read = read_nvml(FakeNvml(switch_node(4, fabric=(cluster.bytes, 32766, 3))))
    assert {(g.fabric_cluster_uuid, g.fabric_clique_id, g.fabric_state) for g in read} == {
        (str(cluster), 32766, "completed")}
    topo = merge_nvml(parse_topo_matrix(
        (FIX / "topo_gb200_4gpu_nv18_8nics_multi_numa_affinity.txt").read_text()), read)
    g = topo.gpus[2]
    assert g.nvlink_domain == f"{cluster}.32766"
    assert (g.name, g.uuid, g.pci_bus_id) == ("NVIDIA H100 80GB HBM3", "GPU-00000002",
                                              "0000:12:00.0")
    assert g.numa_node == 1 and g.gpu_numa_id == 18  # topo -m facts kept
    assert topo.link(0, 3) == "NV18" and len(topo.nics) == 8


def test_fabric_not_finished_gives_no_domain():
    read = read_nvml(FakeNvml(switch_node(2, fabric=(uuid.uuid4().bytes, 7, 2))))
    assert read[0].fabric_state == "in_progress" and read[0].fabric_cluster_uuid is None
    zero = read_nvml(FakeNvml(switch_node(2, fabric=(bytes(16), 0, 3))))
    assert zero[0].fabric_cluster_uuid is None  # single-node systems report a zero uuid


def test_legacy_fabric_call_is_used_when_versioned_is_missing():
    cluster = uuid.uuid4()
    fake = FakeNvml(switch_node(1, fabric=(cluster.bytes, 5, 3)), legacy_fabric=True)
    (g,) = read_nvml(fake)
    assert (g.fabric_cluster_uuid, g.fabric_clique_id) == (str(cluster), 5)
    assert "fabric" in fake.calls and "fabricV" not in fake.calls


def test_init_failure_is_nvml_unavailable():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise FakeNVMLError("NVML Shared Library Not Found")

    with pytest.raises(NvmlUnavailable, match="NVML could not start") as exc:
        read_nvml(Broken([]))
    assert exc.value.missing is True  # no library: a CPU node, not a fault

    class DriverDown(FakeNvml):
        def nvmlInit(self):
            raise FakeNVMLError("Driver Not Loaded")

    with pytest.raises(NvmlUnavailable) as exc:
        read_nvml(DriverDown([]))
    assert exc.value.missing is False


def test_real_pynvml_without_driver_is_unavailable():
    pynvml = pytest.importorskip("pynvml")  # the optional extra; installed in the dev venv
    try:
        gpus = read_nvml(pynvml)
    except NvmlUnavailable as exc:
        assert exc.missing, exc  # no driver library on a CPU machine
        return
    assert all(g.pci_bus_id for g in gpus)  # a machine with a driver: real readings


@pytest.mark.parametrize("raw, want", [
    (b"00000000:07:00.0", "0000:07:00.0"), ("0000:C1:00.0", "0000:c1:00.0"),
    ("00000001:07:00.0", "0001:07:00.0"), ("1000000a:07:00.0", "1000000a:07:00.0"), (b"\x00", None), (None, None)])
def test_normalize_bus_id(raw, want):
    assert normalize_bus_id(raw) == want
