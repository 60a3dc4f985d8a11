"""NVML (nvidia-ml-py, optional extra `meshyard[nvml]`): NVLink state, remote PCI bus id per
link, and the GPU fabric info (cluster UUID + clique id) that names a multi-node NVLink
domain on GB200 NVL72.

`pynvml` is imported inside read_nvml only; every reader takes the module as a parameter
so tests can pass a fake with the same function names. Calls a GPU does not support
(NVML_ERROR_NOT_SUPPORTED, links beyond its count) are skipped, never raised.
"""

from __future__ import annotations

import ctypes
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.topology.model import Gpu, NodeTopology

_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}
_FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


class NvmlUnavailable(RuntimeError):
    """nvidia-ml-py is not installed, or the driver library cannot be loaded.

    `missing` is True when there is simply no NVML here (a CPU node), as opposed to an
    NVML that is present and failing (a driver problem worth reporting)."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class NvLink:
    link: int
    remote_pci_bus_id: str | None
    remote_type: str | None  # gpu | switch | ibmnpu | unknown; None when not reported
    version: int | None = None


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_gb: float | None = None
    numa_node: int | None = None
    nvlinks: tuple[NvLink, ...] = ()  # active links only
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None
    fabric_state: str | None = None


def normalize_bus_id(bus_id: str | bytes | None) -> str | None:
    """NVML prints an 8-digit PCI domain, sysfs and nvidia-smi 4: compare them as one.

    `normalize_bus_id(b'00000000:07:00.0') == '0000:07:00.0'`.
    """
    if bus_id is None:
        return None
    s = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    s = s.strip().strip("\x00").lower()
    if not s:
        return None
    domain, sep, rest = s.partition(":")
    if sep and len(domain) > 4 and set(domain[:-4]) <= {"0"}:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _safe(nvml: Any, fn_name: str, *args: Any) -> Any:
    """Call an NVML function; None when missing from this binding or unsupported here."""
    fn = getattr(nvml, fn_name, None)
    if fn is None:
        return None
    err = getattr(nvml, "NVMLError", Exception)
    try:
        return fn(*args)
    except err:
        return None


def _read_links(nvml: Any, handle: Any) -> tuple[NvLink, ...]:
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    out = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        if _safe(nvml, "nvmlDeviceGetNvLinkState", handle, link) != enabled:
            continue
        pci = _safe(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        rtype = _safe(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        out.append(NvLink(
            link=link,
            remote_pci_bus_id=normalize_bus_id(getattr(pci, "busId", None)),
            remote_type=None if rtype is None else _REMOTE_TYPES.get(int(rtype), "unknown"),
            version=_safe(nvml, "nvmlDeviceGetNvLinkVersion", handle, link)))
    return tuple(out)


def _read_fabric(nvml: Any, handle: Any) -> tuple[str | None, int | None, str | None]:
    """(cluster uuid, clique id, state); uuid/clique only once the fabric manager finished
    registering the GPU (state COMPLETED, status SUCCESS) and the uuid is not all zeros."""
    for struct_name, fn_name in (("c_nvmlGpuFabricInfoV_t", "nvmlDeviceGetGpuFabricInfoV"),
                                 ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo")):
        struct = getattr(nvml, struct_name, None)
        if struct is None or getattr(nvml, fn_name, None) is None:
            continue
        info = struct()
        if _safe(nvml, fn_name, handle, ctypes.byref(info)) is None:
            continue
        state = int(info.state)
        raw = bytes(bytearray(info.clusterUuid))
        ok = state == _FABRIC_COMPLETED and int(info.status) == 0 and any(raw)
        if not ok:
            return None, None, _FABRIC_STATES.get(state, str(state))
        return str(uuid.UUID(bytes=raw[:16])), int(info.cliqueId), "completed"
    return None, None, None


def _read_gpu(nvml: Any, index: int) -> NvmlGpu:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    pci = _safe(nvml, "nvmlDeviceGetPciInfo", h)
    mem = _safe(nvml, "nvmlDeviceGetMemoryInfo", h)
    cluster, clique, state = _read_fabric(nvml, h)
    numa = _safe(nvml, "nvmlDeviceGetNumaNodeId", h)
    return NvmlGpu(
        index=index, name=_text(_safe(nvml, "nvmlDeviceGetName", h)),
        uuid=_text(_safe(nvml, "nvmlDeviceGetUUID", h)),
        pci_bus_id=normalize_bus_id(getattr(pci, "busId", None)),
        memory_gb=round(mem.total / 2**30, 1) if mem is not None else None,
        numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
        nvlinks=_read_links(nvml, h),
        fabric_cluster_uuid=cluster, fabric_clique_id=clique, fabric_state=state)


def import_pynvml() -> Any:
    try:
        import pynvml  # optional extra: nvidia-ml-py
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py is not installed (pip install 'meshyard[nvml]')",
                              missing=True) from exc
    return pynvml


def read_nvml(nvml: Any | None = None) -> tuple[NvmlGpu, ...]:
    """Read every GPU through NVML. Raises NvmlUnavailable without the library or driver."""
    nvml = nvml if nvml is not None else import_pynvml()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        missing = "LibraryNotFound" in type(exc).__name__ or "Library Not Found" in str(exc)
        raise NvmlUnavailable(f"NVML could not start: {exc}", missing=missing) from exc
    try:
        return tuple(_read_gpu(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount())))
    finally:
        nvml.nvmlShutdown()


def nvlink_links(gpus: Sequence[NvmlGpu]) -> dict[tuple[int, int], str]:
    """`NV#` per GPU pair, the way `nvidia-smi topo -m` counts them.

    Direct links: # = active links whose remote bus id is the other GPU. Through NVSwitch:
    every pair of GPUs that both reach a switch gets NV<min of their switch link counts>
    (an H100 SXM with 18 switch links shows NV18 to each peer).
    """
    by_bus = {g.pci_bus_id: g.index for g in gpus if g.pci_bus_id}
    out: dict[tuple[int, int], int] = {}
    switch_links = {g.index: 0 for g in gpus}
    for g in gpus:
        for ln in g.nvlinks:
            peer = by_bus.get(ln.remote_pci_bus_id or "")
            # Old drivers lack the remote-type call: a link whose far end is no GPU of
            # this node then goes to an NVSwitch (H100 switches are not even PCI devices).
            if ln.remote_type == "switch" or (ln.remote_type in (None, "unknown")
                                              and peer is None):
                switch_links[g.index] += 1
            elif ln.remote_type != "ibmnpu" and peer is not None and peer > g.index:
                out[(g.index, peer)] = out.get((g.index, peer), 0) + 1
    on_switch = sorted(i for i, n in switch_links.items() if n)
    for i, a in enumerate(on_switch):
        for b in on_switch[i + 1:]:
            out[(a, b)] = out.get((a, b), 0) + min(switch_links[a], switch_links[b])
    return {pair: f"NV{n}" for pair, n in out.items()}


def merge_nvml(topo: NodeTopology | None, gpus: Sequence[NvmlGpu]) -> NodeTopology:
    """Fill a `topo -m` topology with NVML facts (names, bus ids, fabric); build one from
    NVML alone when `topo -m` was not available (pairs without NVLink become 'SYS')."""
    facts = {g.index: g for g in gpus}
    if topo is None:
        base = tuple(Gpu(index=g.index, numa_node=g.numa_node) for g in gpus)
        nv = nvlink_links(gpus)
        idx = [g.index for g in gpus]
        links = {(a, b): nv.get((a, b), "SYS") for a in idx for b in idx if a < b}
        topo = NodeTopology(gpus=base, links=links)
    merged = []
    for g in topo.gpus:
        f = facts.get(g.index)
        if f is None:
            merged.append(g)
            continue
        merged.append(replace(
            g, name=f.name or g.name, uuid=f.uuid or g.uuid,
            pci_bus_id=f.pci_bus_id or g.pci_bus_id, memory_gb=f.memory_gb or g.memory_gb,
            numa_node=g.numa_node if g.numa_node is not None else f.numa_node,
            fabric_cluster_uuid=f.fabric_cluster_uuid, fabric_clique_id=f.fabric_clique_id))
    return NodeTopology(gpus=tuple(merged), links=dict(topo.links), nics=topo.nics,
                        gpu_nic_links=dict(topo.gpu_nic_links))
