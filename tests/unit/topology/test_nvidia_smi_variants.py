"""Format variants of `nvidia-smi topo -m` beyond the shared samples, and a round-trip
property test: render a random matrix the way the tool does (tabs or spaces, indented
header or not, ANSI codes, NIC legend, empty cells), parse it back, compare."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.topology.model import parse_id_list
from orchestrator.topology.nvidia_smi import parse_topo_matrix, strip_ansi

BOLD, RESET = "\x1b[4m\x1b[1m", "\x1b[0m"


def _tab_row(cells: list[str]) -> str:
    return "\t".join(cells)


def test_ansi_header_tabs_bond_and_netdev_legend():
    header = "\t" + "\t".join(["GPU0", "GPU1", "NIC0", "NIC1", "NIC2", "CPU Affinity",
                               "NUMA Affinity", "GPU NUMA ID"])
    text = "\n".join([
        f"{BOLD}{header}{RESET}",
        _tab_row(["GPU0", " X ", "NV18", "PIX", "SYS", "NODE", "0-55,112-167", "0", "", "N/A"]),
        _tab_row(["GPU1", "NV18", " X ", "SYS", "PIX", "NODE", "0-55,112-167", "0", "", "N/A"]),
        _tab_row(["NIC0", "PIX", "SYS", " X ", "SYS", "SYS"]),
        _tab_row(["NIC1", "SYS", "PIX", "SYS", " X ", "SYS"]),
        _tab_row(["NIC2", "NODE", "NODE", "SYS", "SYS", " X "]),
        "", "Legend:", "", "  X    = Self", "", "NIC Legend:", "",
        "  NIC0: mlx5_bond_0", "  NIC1: mlx5_3", "  NIC2: ens1f0np0", "",
    ])
    t = parse_topo_matrix(text)
    assert t.link(0, 1) == "NV18"
    assert [n.name for n in t.nics] == ["mlx5_bond_0", "mlx5_3", "ens1f0np0"]
    assert t.gpu_nic_links[(0, "mlx5_bond_0")] == "PIX"
    assert t.nearest_nic(1) == "mlx5_3"
    assert t.nics[2].nearest_gpus == (0, 1)  # NODE is better than SYS, so it counts
    g = t.gpus[1]
    assert (g.cpu_affinity, g.numa_node, g.gpu_numa_id) == ("0-55,112-167", 0, None)


def test_unindented_tab_header_and_crlf():
    text = "\r\n".join([
        "GPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity",
        "GPU0\t X \tPXB\tSYS\t0-7\t0",
        "GPU1\tPXB\t X \tSYS\t0-7\t0",
        "GPU2\tSYS\tSYS\t X \t8-15\t1",
    ])
    t = parse_topo_matrix(text)
    assert [t.link(0, 1), t.link(0, 2), t.link(1, 2)] == ["PXB", "SYS", "SYS"]
    assert [(g.cpu_affinity, g.numa_node) for g in t.gpus] == [("0-7", 0), ("0-7", 0),
                                                               ("8-15", 1)]


@pytest.mark.parametrize("sep_after_empty", ["\t", "\t\t"])
def test_empty_cpu_affinity_cell(sep_after_empty):
    # No CPU affinity (e.g. in a container without the cpuset): the cell is empty, and the
    # NUMA value must not slide into the CPU Affinity column.
    header = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [f"GPU0\t X \tNV4\t{sep_after_empty}1\t\tN/A",
            f"GPU1\tNV4\t X \t{sep_after_empty}1\t\tN/A"]
    t = parse_topo_matrix("\n".join([header, *rows]))
    assert [(g.cpu_affinity, g.numa_node, g.numa_affinity) for g in t.gpus] == [
        (None, 1, "1"), (None, 1, "1")]


def test_space_aligned_empty_cpu_affinity():
    text = """\
        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV8                     0               N/A
GPU1    NV8      X                      0               N/A
"""
    t = parse_topo_matrix(text)
    assert [(g.cpu_affinity, g.numa_node) for g in t.gpus] == [(None, 0), (None, 0)]


def test_mp_output_pcie_only_with_nic_rows():
    # `nvidia-smi topo -mp`: same layout, PCIe paths only (no NV#) even on NVLink boxes.
    text = """\
        GPU0    GPU1    GPU2    GPU3    mlx5_0  mlx5_1  CPU Affinity    NUMA Affinity
GPU0     X      PIX     SYS     SYS     PIX     SYS     0-23,48-71      0
GPU1    PIX      X      SYS     SYS     PIX     SYS     0-23,48-71      0
GPU2    SYS     SYS      X      PIX     SYS     PIX     24-47,72-95     1
GPU3    SYS     SYS     PIX      X      SYS     PIX     24-47,72-95     1
mlx5_0  PIX     PIX     SYS     SYS      X      SYS
mlx5_1  SYS     SYS     PIX     PIX     SYS      X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
"""
    t = parse_topo_matrix(text)
    assert set(t.links.values()) == {"PIX", "SYS"}
    assert [n.nearest_gpus for n in t.nics] == [(0, 1), (2, 3)]
    assert t.gpus[3].cpus == tuple(range(24, 48)) + tuple(range(72, 96))


def test_pasted_with_prompt_and_fence():
    text = """$ nvidia-smi topo -m
```
\x1b[1m        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity\x1b[0m
GPU0     X      NV12    PXB     0-31            0
GPU1    NV12     X      SYS     32-63           1
NIC0    PXB     SYS      X
```
NIC Legend:
  NIC0: mlx5_bond_0
"""
    t = parse_topo_matrix(text)
    assert t.link(0, 1) == "NV12" and [n.name for n in t.nics] == ["mlx5_bond_0"]
    assert [g.numa_node for g in t.gpus] == [0, 1] and t.nics[0].nearest_gpus == (0,)


def test_single_gpu():
    t = parse_topo_matrix("        GPU0    CPU Affinity    NUMA Affinity\n"
                          "GPU0     X      0-15            0\n")
    assert t.gpu_indices == (0,) and dict(t.links) == {}
    assert t.gpus[0].cpu_affinity == "0-15"


@pytest.mark.parametrize("text, fragment", [
    ("No devices were found", "no `nvidia-smi topo -m` matrix found"),
    ("", "no `nvidia-smi topo -m` matrix found"),
    ("        GPU0    GPU1\n\nLegend:\n", "no 'GPU0  X ...' rows"),
    ("        GPU0    GPU1\nGPU0     X      NV1\nGPU1    NV1\n", "row 'GPU1' has 1 cells"),
])
def test_errors_say_what_is_wrong(text, fragment):
    with pytest.raises(ValueError, match=None) as exc:
        parse_topo_matrix(text)
    assert fragment in str(exc.value)


def test_parse_id_list():
    assert parse_id_list("0,3-5,11") == (0, 3, 4, 5, 11)
    assert parse_id_list("N/A") == () and parse_id_list(None) == ()
    with pytest.raises(ValueError, match="bad id list"):
        parse_id_list("0-a")


# ---------------------------------------------------------------- property test

LINKS = ["NV1", "NV2", "NV4", "NV6", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"]
NIC_NAMES = ["mlx5_0", "mlx5_2", "mlx5_bond_0", "ens1f0np0", "ibp12s0", "mlx5_11"]
cpu_lists = st.one_of(st.just(""), st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)),
                                            min_size=1, max_size=3).map(
    lambda xs: ",".join(f"{a}-{a + w}" if w else str(a) for a, w in xs)))
numa_vals = st.one_of(st.just("N/A"), st.integers(0, 7).map(str),
                      st.sampled_from(["0,3-9,11-17", "1,19-25,27-33"]))


@st.composite
def matrices(draw):
    n = draw(st.integers(1, 8))
    k = draw(st.integers(0, 4))
    links = {(a, b): draw(st.sampled_from(LINKS)) for a in range(n) for b in range(a + 1, n)}
    gpu_nic = {(g, j): draw(st.sampled_from(LINKS[6:])) for g in range(n) for j in range(k)}
    nic_names = draw(st.lists(st.sampled_from(NIC_NAMES), min_size=k, max_size=k, unique=True))
    cpus = [draw(cpu_lists) for _ in range(n)]
    numa = [draw(numa_vals) for _ in range(n)]
    gpu_numa = draw(st.booleans())
    style = draw(st.fixed_dictionaries({
        "tabs": st.booleans(), "indent": st.sampled_from(["\t", "", "        "]),
        "ansi": st.booleans(), "legend": st.booleans(), "crlf": st.booleans(),
        "trailing": st.sampled_from(["", " ", "\t"])}))
    return n, k, links, gpu_nic, nic_names, cpus, numa, gpu_numa, style


def _render(n, k, links, gpu_nic, nic_names, cpus, numa, gpu_numa, style) -> str:
    """Lay the matrix out the way nvidia-smi does: cells on 8-column tab stops, trailing
    columns padded with tabs to the header's width; empty cells are just padding."""
    nic_cols = [f"NIC{j}" if style["legend"] else nic_names[j] for j in range(k)]
    devs = [f"GPU{i}" for i in range(n)] + nic_cols
    trailers = ["CPU Affinity", "NUMA Affinity"] + (["GPU NUMA ID"] if gpu_numa else [])

    def cell(a: int, b: int) -> str:
        if a == b:
            return " X "
        if a < n and b < n:
            return links[(min(a, b), max(a, b))]
        if a < n:
            return gpu_nic[(a, b - n)]
        if b < n:
            return gpu_nic[(b, a - n)]
        return "SYS"

    def pad_join(items: list[str], widths: list[int]) -> str:
        out = ""
        for item, w in zip(items, widths, strict=True):
            out += item + "\t" * max(1, (w - len(item) + 7) // 8)
        return out.rstrip("\t")

    widths = [max(16, ((len(t) // 8) + 1) * 8) for t in trailers]
    head = style["indent"] + "\t".join(devs) + "\t" + "\t".join(trailers)
    lines = [head]
    for a, label in enumerate(devs):
        row = label + "\t" + "\t".join(cell(a, b) for b in range(len(devs)))
        if a < n:
            vals = [cpus[a], numa[a]] + (["N/A"] if gpu_numa else [])
            row += "\t" + pad_join(vals, widths)
        lines.append(row + style["trailing"])
    if style["ansi"]:
        lines[0] = BOLD + lines[0] + RESET
    lines += ["", "Legend:", "", "  X    = Self"]
    if style["legend"] and k:
        lines += ["", "NIC Legend:", ""] + [f"  NIC{j}: {nic_names[j]}" for j in range(k)]
    if not style["tabs"]:
        lines = [ln.expandtabs(8) for ln in lines]
    return ("\r\n" if style["crlf"] else "\n").join(lines)


@settings(max_examples=150, deadline=None)
@given(matrices())
def test_render_then_parse_round_trip(m):
    n, k, links, gpu_nic, nic_names, cpus, numa, gpu_numa, style = m
    text = _render(*m)
    t = parse_topo_matrix(text)
    assert t.gpu_indices == tuple(range(n))
    assert dict(t.links) == links
    assert [x.name for x in t.nics] == nic_names
    assert dict(t.gpu_nic_links) == {(g, nic_names[j]): v for (g, j), v in gpu_nic.items()}
    assert [g.cpu_affinity for g in t.gpus] == [c or None for c in cpus]
    assert [g.numa_affinity for g in t.gpus] == [None if v == "N/A" else v for v in numa]
    assert "\x1b" not in strip_ansi(text)
