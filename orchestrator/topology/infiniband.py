"""InfiniBand / RoCE ports from sysfs (`/sys/class/infiniband/<dev>/ports/<n>/...`) and from
`ibstat` text. Pure: the sysfs root is a parameter, so tests use a fake tree.

File formats (drivers/infiniband/core/sysfs.c):
  state       "4: ACTIVE"            phys_state  "5: LinkUp"
  rate        "400 Gb/sec (4X NDR)"  link_layer  "InfiniBand" | "Ethernet" | "Unknown"
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.text.ansi import strip_ansi
from orchestrator.topology.model import Nic, NodeTopology

SYSFS_IB = "/sys/class/infiniband"
_CODE_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
_RATE_RE = re.compile(r"^\s*([\d.]+)\s*Gb/sec(?:\s*\((.*)\))?")


@dataclass(frozen=True)
class IbPort:
    device: str  # mlx5_0, mlx5_bond_0
    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str | None = None  # LinkUp, Polling, Disabled
    rate_gbps: float | None = None
    rate_text: str | None = None  # "4X NDR"
    link_layer: str | None = None  # InfiniBand | Ethernet

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


def parse_coded(text: str | None) -> str | None:
    """'4: ACTIVE' → 'ACTIVE'; a bare word is returned as is."""
    if text is None or not text.strip():
        return None
    m = _CODE_RE.match(text)
    return m.group(2) if m else text.strip()


def parse_rate(text: str | None) -> tuple[float | None, str | None]:
    """'400 Gb/sec (4X NDR)' → (400.0, '4X NDR'); '2.5 Gb/sec (1X)' → (2.5, '1X')."""
    if not text:
        return None, None
    m = _RATE_RE.match(text)
    if not m:
        return None, None
    return float(m.group(1)), m.group(2)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # missing attribute, permission, a port that vanished
        return None


def read_ib_ports(root: str | Path = SYSFS_IB) -> tuple[IbPort, ...]:
    """Every port of every RDMA device under `root`; () when there is none (never raises)."""
    base = Path(root)
    if not base.is_dir():
        return ()
    ports = []
    for dev in sorted(base.iterdir(), key=lambda p: p.name):
        pdir = dev / "ports"
        if not pdir.is_dir():
            continue
        for port in sorted(pdir.iterdir(), key=lambda p: (len(p.name), p.name)):
            if not port.name.isdigit():
                continue
            rate, rate_text = parse_rate(_read(port / "rate"))
            ports.append(IbPort(device=dev.name, port=int(port.name),
                                state=parse_coded(_read(port / "state")),
                                phys_state=parse_coded(_read(port / "phys_state")),
                                rate_gbps=rate, rate_text=rate_text,
                                link_layer=_read(port / "link_layer")))
    return tuple(ports)


def parse_ibstat(text: str) -> tuple[IbPort, ...]:
    """Ports from `ibstat` output (blocks `CA 'mlx5_0'` / `Port 1:` / `State: Active`)."""
    ports: list[IbPort] = []
    ca: str | None = None
    cur: dict[str, str] = {}
    port_no: int | None = None

    def flush() -> None:
        if ca is not None and port_no is not None:
            rate = cur.get("Rate")
            ports.append(IbPort(
                device=ca, port=port_no, state=(cur.get("State") or "").upper() or None,
                phys_state=cur.get("Physical state"),
                rate_gbps=float(rate) if rate and re.match(r"^[\d.]+$", rate) else None,
                link_layer=cur.get("Link layer")))

    for line in strip_ansi(text).splitlines():
        s = line.strip()
        if m := re.match(r"^CA '([^']+)'", s):
            flush()
            ca, port_no, cur = m.group(1), None, {}
        elif m := re.match(r"^Port (\d+):$", s):
            flush()
            port_no, cur = int(m.group(1)), {}
        elif ":" in s and port_no is not None:
            key, _, val = s.partition(":")
            cur[key.strip()] = val.strip()
    flush()
    return tuple(ports)


def _best_port(ports: list[IbPort]) -> IbPort:
    return sorted(ports, key=lambda p: (not p.active, -(p.rate_gbps or 0), p.port))[0]


def apply_ib_ports(topo: NodeTopology, ports: tuple[IbPort, ...]) -> NodeTopology:
    """Fill NIC link layer / rate / state from the ports (the best port per device: active,
    then fastest). Devices `topo -m` did not list are appended with no GPU affinity."""
    by_dev: dict[str, list[IbPort]] = {}
    for p in ports:
        by_dev.setdefault(p.device, []).append(p)
    nics = []
    for nic in topo.nics:
        ps = by_dev.pop(nic.name, None)
        if ps:
            best = _best_port(ps)
            nic = replace(nic, link_layer=best.link_layer, rate_gbps=best.rate_gbps,
                          state=best.state)
        nics.append(nic)
    for dev, ps in sorted(by_dev.items()):
        best = _best_port(ps)
        nics.append(Nic(name=dev, link_layer=best.link_layer, rate_gbps=best.rate_gbps,
                        state=best.state))
    return NodeTopology(gpus=topo.gpus, links=dict(topo.links), nics=tuple(nics),
                        gpu_nic_links=dict(topo.gpu_nic_links))
