"""GPU errors the driver reports: `nvidia-smi -q` (ECC counts, retired pages, remapped rows)
and Xid events in the kernel log. Pure module; the node evidence collector runs it on each
node of a diagnosis round (orchestrator/runtime/node_evidence.py).

`nvidia-smi -q` lists the GPUs in nvidia-smi's index order, each under its PCI bus id:

    GPU 00000000:18:00.0
        Minor Number                          : 0
        ECC Errors
            Volatile
                DRAM Uncorrectable            : 2         (Ampere and newer)
                Double Bit
                    Total                     : 0         (Volta and older)
        Retired Pages
            Pending Page Blacklist            : Yes
        Remapped Rows
            Pending                           : Yes

The kernel log names the GPU by bus id: `NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has
fallen off the bus.` (older drivers: `NVRM: Xid (0000:18:00): 48, ...`).

What takes a GPU out of service (the health policy cordons it), after NVIDIA's Xid catalog:
uncorrectable ECC errors (volatile or aggregate), a retired page or remapped row pending (the
GPU needs a reset), a failed row remapping, and Xid
    48  double-bit (uncorrectable) ECC error        79  GPU has fallen off the bus
    63  ECC page retirement / row remapping event   94  contained uncorrectable ECC error
    64  page retirement / row remapping failure     95  uncontained uncorrectable ECC error
    74  NVLink error
Other Xids (13 graphics exception, 31 memory page fault, 43 GPU stopped processing, 45
preemptive cleanup, ...) are most often the application's and are only reported.

>>> smi = "GPU 00000000:18:00.0\\n    ECC Errors\\n        Volatile\\n" \\
...       "            DRAM Uncorrectable            : 2\\n"
>>> [(g.index, g.reasons) for g in gpu_errors(smi, "NVRM: Xid (PCI:0000:18:00): 79, pid=1")]
[(0, ('2 uncorrectable ECC errors (volatile)', 'Xid 79: GPU has fallen off the bus'))]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FATAL_XIDS = {
    48: "double-bit ECC error",
    63: "ECC page retirement / row remapping recorded (reset the GPU)",
    64: "ECC page retirement / row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained uncorrectable ECC error",
    95: "uncontained uncorrectable ECC error",
}

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_FIELD = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
                  r"(?:\.[0-9A-Fa-f])?\): (\d+)(?:,\s*(.*))?")


def bus_key(bus_id: str) -> tuple[int, int, int]:
    """(domain, bus, device) of "00000000:18:00.0" or "0000:18:00": the two spellings meet."""
    domain, bus, dev = bus_id.split(".")[0].split(":")
    return int(domain, 16), int(bus, 16), int(dev, 16)


@dataclass(frozen=True)
class Xid:
    bus_id: str
    code: int
    text: str = ""

    @property
    def fatal(self) -> bool:
        return self.code in FATAL_XIDS


@dataclass(frozen=True)
class GpuErrors:
    """One GPU's driver-reported errors. `index`: nvidia-smi's index (its order in -q)."""

    index: int
    bus_id: str
    minor: int | None = None
    volatile_uncorrectable: int = 0
    aggregate_uncorrectable: int = 0
    retired_pending: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    xids: tuple[Xid, ...] = field(default_factory=tuple)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why this GPU should leave service; () when nothing says so."""
        out = []
        for n, what in ((self.volatile_uncorrectable, "volatile"),
                        (self.aggregate_uncorrectable, "aggregate")):
            if n and (what == "volatile" or not self.volatile_uncorrectable):
                out.append(f"{n} uncorrectable ECC error{'s' if n != 1 else ''} ({what})")
        if self.retired_pending:
            out.append("retired page pending (reset the GPU)")
        if self.remap_pending:
            out.append("remapped row pending (reset the GPU)")
        if self.remap_failed:
            out.append("row remapping failed")
        for code in dict.fromkeys(x.code for x in self.xids if x.fatal):
            out.append(f"Xid {code}: {FATAL_XIDS[code]}")
        return tuple(out)

    @property
    def other_xids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(x.code for x in self.xids if not x.fatal))


def _int(value: str) -> int:
    return int(value) if value.isdigit() else 0


def _yes(value: str) -> bool:
    return value.strip().lower() == "yes"


@dataclass
class _Gpu:
    bus_id: str
    minor: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)


def _fold(gpu: _Gpu, path: tuple[str, ...], name: str, value: str) -> None:
    where = [p.lower() for p in path]
    key = name.lower()
    if not where and key == "minor number":
        gpu.minor = _int(value)
    elif where[:1] == ["ecc errors"] and len(where) >= 2:
        scope = where[1]  # volatile | aggregate
        # Ampere+: "DRAM / SRAM Uncorrectable" (and "SRAM Uncorrectable Parity / SEC-DED");
        # Volta and older: "Double Bit" > "Total".
        if ("uncorrectable" in key and "threshold" not in key) or \
                (where[2:3] == ["double bit"] and key == "total"):
            gpu.counts[scope] = gpu.counts.get(scope, 0) + _int(value)
    elif where[:1] == ["retired pages"] and key in ("pending page blacklist", "pending"):
        gpu.flags["retired_pending"] = _yes(value)
    elif where[:1] == ["remapped rows"]:
        if key == "pending":
            gpu.flags["remap_pending"] = _yes(value)
        elif key == "remapping failure occurred":
            gpu.flags["remap_failed"] = _yes(value)


def parse_smi_q(text: str) -> list[_Gpu]:
    """The GPUs of an `nvidia-smi -q` dump (full, or `-d ECC,PAGE_RETIREMENT,...`)."""
    gpus: list[_Gpu] = []
    stack: list[tuple[int, str]] = []  # (indent, section name) above the current line
    for line in text.splitlines():
        head = _GPU_HEADER.match(line)
        if head:
            gpus.append(_Gpu(bus_id=head.group(1)))
            stack = []
            continue
        if not gpus or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = _FIELD.match(line)
        if m:
            _fold(gpus[-1], tuple(s for _, s in stack), m.group(2).strip(), m.group(3))
        else:
            stack.append((indent, line.strip()))
    return gpus


def parse_xids(text: str) -> list[Xid]:
    """Every `NVRM: Xid (...)` event in kernel log text (dmesg, journalctl -k, syslog)."""
    return [Xid(bus_id=m.group(1), code=int(m.group(2)), text=(m.group(3) or "")[:300])
            for m in _XID.finditer(text)]


def gpu_errors(smi_text: str, kernel_text: str = "") -> list[GpuErrors]:
    """Per GPU of `smi_text`, its ECC / retirement / remapping state and its Xid events."""
    xids = parse_xids(kernel_text)
    out = []
    for i, g in enumerate(parse_smi_q(smi_text)):
        key = bus_key(g.bus_id)
        mine = tuple(x for x in xids if bus_key(x.bus_id) == key)
        out.append(GpuErrors(
            index=i, bus_id=g.bus_id, minor=g.minor,
            volatile_uncorrectable=g.counts.get("volatile", 0),
            aggregate_uncorrectable=g.counts.get("aggregate", 0),
            retired_pending=g.flags.get("retired_pending", False),
            remap_pending=g.flags.get("remap_pending", False),
            remap_failed=g.flags.get("remap_failed", False), xids=mine))
    return out


def to_dicts(errors: list[GpuErrors]) -> list[dict[str, object]]:
    """The GPUs with something to report, as the node collector returns them over Ray."""
    return [{"index": g.index, "bus_id": g.bus_id, "reasons": list(g.reasons),
             "other_xids": list(g.other_xids)} for g in errors if g.reasons or g.other_xids]
