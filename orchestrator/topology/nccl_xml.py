"""NCCL topology XML (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`) → NodeTopology. Pure.

Clouds ship these files for VMs whose PCIe switches are hidden (Azure ND H100 v5 declares a
synthetic bridge per GPU/NIC pair). Tree: <system> / <cpu numaid affinity> / <pci busid
class> (bridges, class 0x0604xx) / <pci> devices: GPUs are class 0x03xxxx (with an optional
<gpu dev=...> holding <nvlink target count tclass>), NICs 0x02xxxx (with <nic><net name
speed>). Link classes follow `nvidia-smi topo -m`: same parent bridge PIX, a common bridge
higher up PXB, only the CPU in common PHB, different CPUs SYS; NVLinks give NV<count>.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from orchestrator.text.ansi import strip_ansi
from orchestrator.topology.model import Gpu, Nic, NodeTopology, link_cost
from orchestrator.topology.nvml import normalize_bus_id

_NVSWITCH_CLASS = "0x0680"


@dataclass(frozen=True)
class _Dev:
    bus: str
    cpu: int
    bridges: tuple[str, ...]  # bridge bus ids from the CPU down to the device's parent
    elem: ET.Element
    affinity: str | None


def mask_to_cpu_list(mask: str | None) -> str | None:
    """NCCL/sysfs cpumask ('ffffffff,ffff0000,00000000', most significant word first) →
    '48-95'."""
    if not mask:
        return None
    value = int(mask.replace(",", ""), 16)
    cpus = [i for i in range(value.bit_length()) if value >> i & 1]
    parts: list[list[int]] = []
    for c in cpus:
        if parts and parts[-1][1] == c - 1:
            parts[-1][1] = c
        else:
            parts.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in parts) or None


def _walk(elem: ET.Element, *, cpu: int, affinity: str | None, bridges: tuple[str, ...],
          out: list[_Dev]) -> None:
    for child in elem:
        if child.tag != "pci":
            continue
        bus = normalize_bus_id(child.get("busid")) or ""
        cls = (child.get("class") or "").lower()
        if cls.startswith("0x0604"):
            _walk(child, cpu=cpu, affinity=affinity, bridges=(*bridges, bus), out=out)
        else:
            out.append(_Dev(bus=bus, cpu=cpu, bridges=bridges, elem=child, affinity=affinity))


def _pci_link(a: _Dev, b: _Dev) -> str:
    if a.cpu != b.cpu:
        return "SYS"
    common = 0
    while (common < min(len(a.bridges), len(b.bridges))
           and a.bridges[common] == b.bridges[common]):
        common += 1
    if common == 0:
        return "PHB"
    return "PIX" if len(a.bridges) == len(b.bridges) == common else "PXB"


def _nvlinks(gpus: list[_Dev]) -> dict[tuple[int, int], int]:
    index = {d.bus: i for i, d in enumerate(gpus)}
    direct: dict[tuple[int, int], int] = {}
    via_switch: dict[int, int] = {}
    for i, d in enumerate(gpus):
        for nv in d.elem.iter("nvlink"):
            count = int(nv.get("count", "1"))
            target = normalize_bus_id(nv.get("target"))
            tclass = (nv.get("tclass") or "").lower()
            if tclass.startswith(_NVSWITCH_CLASS):
                via_switch[i] = via_switch.get(i, 0) + count
            elif target in index and index[target] > i:
                key = (i, index[target])
                direct[key] = direct.get(key, 0) + count
    on = sorted(via_switch)
    for x, a in enumerate(on):
        for b in on[x + 1:]:
            direct[(a, b)] = direct.get((a, b), 0) + min(via_switch[a], via_switch[b])
    return direct


def _nic(k: int, d: _Dev, gpus: list[_Dev]) -> tuple[Nic, dict[int, str]]:
    net = d.elem.find("./nic/net")
    speed = net.get("speed") if net is not None else None
    links = {i: _pci_link(g, d) for i, g in enumerate(gpus)}
    best = min((link_cost(t) for t in links.values()), default=None)
    near = tuple(i for i, t in links.items() if link_cost(t) == best and t not in ("SYS",))
    name = (net.get("name") if net is not None else None) or f"NIC{k}"
    return Nic(name=name, index=k, rate_gbps=float(speed) / 1000 if speed else None,
               nearest_gpus=near, pci_bus_id=d.bus), links


def parse_nccl_topo_xml(text: str) -> NodeTopology:
    """GPUs are numbered by `<gpu dev=...>` when present, else in PCI bus order (what
    nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID use)."""
    try:
        root = ET.fromstring(strip_ansi(text).strip())
    except ET.ParseError as exc:
        raise ValueError(f"not an NCCL topology XML: {exc}") from exc
    devs: list[_Dev] = []
    for cpu in root.iter("cpu"):
        _walk(cpu, cpu=int(cpu.get("numaid", "0")),
              affinity=mask_to_cpu_list(cpu.get("affinity")), bridges=(), out=devs)
    gpus = [d for d in devs if (d.elem.get("class") or "").lower().startswith("0x03")]
    nics = [d for d in devs if (d.elem.get("class") or "").lower().startswith("0x02")]

    def order(d: _Dev) -> tuple[int, str]:
        g = d.elem.find("gpu")
        return (int(g.get("dev", "0")) if g is not None and g.get("dev") else 0, d.bus)

    gpus.sort(key=order)
    nics.sort(key=lambda d: d.bus)
    if not gpus:
        raise ValueError("NCCL topology XML lists no GPU (pci class 0x03xxxx)")
    nv = _nvlinks(gpus)
    links = {(a, b): f"NV{nv[(a, b)]}" if (a, b) in nv else _pci_link(gpus[a], gpus[b])
             for a in range(len(gpus)) for b in range(a + 1, len(gpus))}
    nic_objs, gpu_nic = [], {}
    for k, d in enumerate(nics):
        nic, per_gpu = _nic(k, d, gpus)
        nic_objs.append(nic)
        gpu_nic.update({(i, nic.name): t for i, t in per_gpu.items()})
    gpu_objs = tuple(Gpu(index=i, numa_node=d.cpu, cpu_affinity=d.affinity, pci_bus_id=d.bus)
                     for i, d in enumerate(gpus))
    return NodeTopology(gpus=gpu_objs, links=links, nics=tuple(nic_objs), gpu_nic_links=gpu_nic)
