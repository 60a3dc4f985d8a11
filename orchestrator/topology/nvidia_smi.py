"""Parser for `nvidia-smi topo -m` (and `-mp`) text → NodeTopology. Pure, stdlib only.

The output is a square device matrix (GPUs, then NICs) followed by per-GPU columns
(`CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID`) and legends. Real captures vary:
tab-separated or space-aligned (tabs expanded by whoever copied them), header indented or
not, terminal escape codes (nvidia-smi underlines the header, `\tESC[4mGPU0 ... ESC[0m`;
copies keep them, their ESC-less residue or caret notation: all go through
`orchestrator.text.ansi.strip_ansi` before anything else), legacy `SOC` for `SYS`, NIC columns named
`NICk` with a `NIC Legend:` mapping them to `mlx5_2` / `mlx5_bond_0` / netdev names (or
named by device directly on old drivers), empty CPU-affinity cells, NUMA lists such as
`0,3-9,11-17`, and `N/A`.

Trailing columns are matched by position, not by order, because nvidia-smi pads them with
a variable number of tabs and leaves empty cells when it has no value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.text.ansi import strip_ansi
from orchestrator.topology.model import Gpu, Nic, NodeTopology, link_cost

__all__ = ["parse_nic_legend", "parse_topo_matrix", "strip_ansi"]

_TOKEN_RE = re.compile(r"\S+")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_NIC_LEGEND_RE = re.compile(r"^\s*NIC(\d+)\s*:\s*(\S+)\s*$")
_TRAILER_SPLIT_RE = re.compile(r"\s{2,}")
_POOR_NIC_LINKS = frozenset({"SYS", "SOC"})

CPU_AFFINITY = "CPU Affinity"
NUMA_AFFINITY = "NUMA Affinity"
GPU_NUMA_ID = "GPU NUMA ID"


@dataclass(frozen=True)
class _Token:
    text: str
    start: int


def _tokens(line: str) -> list[_Token]:
    return [_Token(m.group(0), m.start()) for m in _TOKEN_RE.finditer(line)]


def _clean_lines(text: str) -> list[str]:
    lines = strip_ansi(text).replace("\r", "").split("\n")
    return [ln.expandtabs(8).rstrip() for ln in lines]


def _is_header(line: str) -> bool:
    toks = line.split()
    if not toks or toks[0] != "GPU0":
        return False
    return len(toks) == 1 or toks[1] not in ("X",) and not toks[1].startswith("NV")


def _find_header(lines: list[str]) -> int:
    for i, ln in enumerate(lines):
        if not ln.lstrip().startswith("#") and _is_header(ln):
            return i
    raise ValueError(
        "no `nvidia-smi topo -m` matrix found: expected a header line starting with 'GPU0' "
        "followed by rows 'GPU0  X  ...'; pass the full output of `nvidia-smi topo -m`"
    )


def _matrix_rows(lines: list[str], header: list[_Token]) -> list[list[_Token]]:
    """Rows after the header whose label names a header column; stops at a blank/legend."""
    names = {t.text for t in header}
    rows: list[list[_Token]] = []
    for ln in lines:
        if not ln.strip():
            if rows:
                break
            continue
        toks = _tokens(ln)
        if toks[0].text.rstrip(":") in ("Legend", "NIC"):
            break
        if toks[0].text not in names:
            if rows:
                break
            continue
        rows.append(toks)
    return rows


def _trailer_columns(header_line: str, dev_end: int, offset: int) -> list[_Token]:
    """Column names after the device columns; names contain single spaces ('CPU Affinity')."""
    rest = header_line[dev_end:]
    cols: list[_Token] = []
    pos = 0
    for piece in _TRAILER_SPLIT_RE.split(rest):
        idx = rest.index(piece, pos) if piece else pos
        pos = idx + len(piece)
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            cols.append(_Token(piece.strip(), dev_end + idx + lead + offset))
    return cols


def _assign_trailers(values: list[_Token], cols: list[_Token]) -> dict[str, str]:
    """Map the trailing cells of a row onto columns: in order when every cell is present,
    else each to the nearest column start (ties go right: an empty cell shifts text right)."""
    if len(values) >= len(cols):
        return {c.text: v.text for c, v in zip(cols, values, strict=False)}
    out: dict[str, str] = {}
    j = 0
    for v in values:
        best = min(range(j, len(cols)), key=lambda k: (abs(cols[k].start - v.start), -k))
        remaining_vals = len(values) - len(out) - 1
        best = min(best, len(cols) - 1 - remaining_vals)  # leave room for the cells after
        out[cols[best].text] = v.text
        j = best + 1
    return out


def _opt(text: str | None) -> str | None:
    if text is None or not text.strip() or text.strip().upper() == "N/A":
        return None
    return text.strip()


def _first_int(text: str | None) -> int | None:
    t = _opt(text)
    if t is None:
        return None
    m = re.match(r"^(\d+)", t)
    return int(m.group(1)) if m else None


def parse_nic_legend(lines: list[str]) -> dict[str, str]:
    """`NIC0: mlx5_0` lines after 'NIC Legend:' → {'NIC0': 'mlx5_0'}."""
    out: dict[str, str] = {}
    in_legend = False
    for ln in lines:
        if ln.strip().startswith("NIC Legend"):
            in_legend = True
            continue
        m = _NIC_LEGEND_RE.match(ln)
        if in_legend and m:
            out[f"NIC{m.group(1)}"] = m.group(2)
    return out


def parse_topo_matrix(text: str) -> NodeTopology:
    """Parse `nvidia-smi topo -m` output into a NodeTopology.

    Link types are kept exactly as printed ('NV12', 'PIX', 'SOC', ...). NICs get their real
    names via the NIC Legend. Raises ValueError naming the row when the matrix is malformed.
    """
    lines = _clean_lines(text)
    h = _find_header(lines)
    header = _tokens(lines[h])
    rows = _matrix_rows(lines[h + 1:], header)
    if not rows:
        raise ValueError("`nvidia-smi topo -m` header found but no 'GPU0  X ...' rows follow it")
    labels = [r[0].text for r in rows]
    n_dev = 0
    while n_dev < len(header) and header[n_dev].text in labels:
        n_dev += 1
    devices = [t.text for t in header[:n_dev]]
    for r in rows:
        if len(r) < 1 + n_dev:
            raise ValueError(
                f"row {r[0].text!r} has {len(r) - 1} cells but the header names {n_dev} "
                "devices; the output looks truncated or re-wrapped"
            )
    offset = _header_offset(rows[0], header, n_dev)
    dev_end = header[n_dev - 1].start + len(header[n_dev - 1].text) if n_dev else 0
    trailers = _trailer_columns(lines[h], dev_end, offset)
    legend = parse_nic_legend(lines)
    return _build(rows=rows, devices=devices, trailers=trailers, legend=legend)


def _header_offset(row: list[_Token], header: list[_Token], n_dev: int) -> int:
    """How far the row's cells sit right of their header names (0 for an indented header,
    8 when the header starts at column 0). ' X ' cells sit one further right: ignored."""
    shifts = [row[1 + i].start - header[i].start for i in range(n_dev) if row[1 + i].text != "X"]
    if shifts:
        return min(shifts)
    return row[1].start - header[0].start - 1 if n_dev else 0


def _gpu_from_row(index: int, extra: dict[str, str]) -> Gpu:
    numa_aff = _opt(extra.get(NUMA_AFFINITY))
    return Gpu(index=index, cpu_affinity=_opt(extra.get(CPU_AFFINITY)),
               numa_affinity=numa_aff, numa_node=_first_int(numa_aff),
               gpu_numa_id=_first_int(extra.get(GPU_NUMA_ID)))


def _build(*, rows: list[list[_Token]], devices: list[str], trailers: list[_Token],
           legend: dict[str, str]) -> NodeTopology:
    n_dev = len(devices)
    gpu_cols = {i: int(m.group(1)) for i, d in enumerate(devices) if (m := _GPU_RE.match(d))}
    nic_cols = {i: legend.get(d, d) for i, d in enumerate(devices) if i not in gpu_cols}
    gpus: list[Gpu] = []
    links: dict[tuple[int, int], str] = {}
    gpu_nic: dict[tuple[int, str], str] = {}
    for r in rows:
        m = _GPU_RE.match(r[0].text)
        if not m:
            continue
        a = int(m.group(1))
        cells = [t.text for t in r[1:1 + n_dev]]
        gpus.append(_gpu_from_row(a, _assign_trailers(r[1 + n_dev:], trailers)))
        for col, b in gpu_cols.items():
            if a < b:
                links[(a, b)] = cells[col]
        for col, nic in nic_cols.items():
            gpu_nic[(a, nic)] = cells[col]
    nics = tuple(_nic(name=name, devname=devices[col], gpu_nic=gpu_nic)
                 for col, name in nic_cols.items())
    return NodeTopology(gpus=tuple(sorted(gpus, key=lambda g: g.index)), links=links,
                        nics=nics, gpu_nic_links=gpu_nic)


def _nic(*, name: str, devname: str, gpu_nic: dict[tuple[int, str], str]) -> Nic:
    m = re.match(r"^NIC(\d+)$", devname)
    per_gpu = {g: t for (g, n), t in gpu_nic.items() if n == name}
    nearest: tuple[int, ...] = ()
    if per_gpu:
        best = min(link_cost(t) for t in per_gpu.values())
        good = [g for g, t in per_gpu.items() if link_cost(t) == best and t not in _POOR_NIC_LINKS]
        nearest = tuple(sorted(good))
    return Nic(name=name, index=int(m.group(1)) if m else None, nearest_gpus=nearest)
