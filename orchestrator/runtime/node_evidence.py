"""Per-node hang evidence, read where it is: the ranks' last announcements (each on its rank's
node, `gather_announcements`) and, once per node of a GPU job from a Ray task pinned to that node,
into the round's `node-<name>/` folder: `nvidia-smi -q` (ECC counts, retired pages, remapped
rows, NVLink state) and the kernel log's `NVRM: Xid` lines (dmesg, else journalctl -k). The
task parses both on the node (orchestrator/watchdog/gpu_errors.py) and returns, besides the
artifact paths, the GPUs whose driver reports errors, which the diagnosis then names."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.runtime.on_nodes import run_on_nodes
from orchestrator.watchdog.evidence_files import PathLike, node_dir, read_announcement
from orchestrator.watchdog.gpu_errors import gpu_errors, to_dicts

_KERNEL_LOG = (["dmesg"], ["journalctl", "-k", "--no-pager", "-n", "20000"])
_XID_MARK = "NVRM: Xid"


@dataclass(frozen=True)
class NodeEvidence:
    paths: list[str] = field(default_factory=list)
    gpus: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # node -> GPU errors


def _run(argv: list[str], timeout_s: float) -> str | None:
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, *argv[1:]], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as ex:
        return f"{argv[0]} failed: {ex}"
    return res.stdout if res.returncode == 0 else None


def kernel_xid_lines(timeout_s: float) -> str:
    """The kernel log's Xid lines (dmesg needs CAP_SYSLOG where dmesg_restrict is set; the
    journal is the fallback); '' when neither can be read."""
    for argv in _KERNEL_LOG:
        text = _run(argv, timeout_s)
        if text is not None:
            return "\n".join(ln for ln in text.splitlines() if _XID_MARK in ln)
    return ""


def collect_node_evidence(run_dir: PathLike, *, stamp: str, node: str | None = None,
                          timeout_s: float = 20.0) -> dict[str, Any]:
    """Runs on the node: {"paths": artifacts, "gpus": the GPUs with driver errors}; nothing
    without nvidia-smi (CPU nodes)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"paths": [], "gpus": []}
    out_dir = node_dir(run_dir, stamp=stamp, node=node or socket.gethostname())
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=timeout_s,
                             check=False)
        text = res.stdout + res.stderr
    except (OSError, subprocess.SubprocessError) as ex:
        text = f"nvidia-smi failed: {ex}"
    path = out_dir / "nvidia-smi-q.txt"
    path.write_text(text)
    paths = [str(path)]
    xids = kernel_xid_lines(timeout_s)
    if xids:
        kernel = out_dir / "kernel-xid.log"
        kernel.write_text(xids + "\n")
        paths.append(str(kernel))
    return {"paths": paths, "gpus": to_dicts(gpu_errors(text, xids))}


def gather_node_evidence(nodes: Mapping[str, str | None], *, run_dir: str, stamp: str,
                         timeout_s: float) -> NodeEvidence:
    """`collect_node_evidence` on every node (Ray node id -> node name); a node that does not
    answer in time adds nothing (the rest of the round must not wait on it)."""
    got = run_on_nodes(collect_node_evidence, {
        nid: {"run_dir": run_dir, "stamp": stamp, "node": name} for nid, name in nodes.items()},
        timeout_s=timeout_s)
    out = NodeEvidence()
    for nid, ev in got.items():
        if isinstance(ev, Exception):  # a missing nvidia-smi dump is not fatal
            continue
        out.paths.extend(ev.get("paths") or [])
        if ev.get("gpus"):
            out.gpus[nodes[nid] or nid] = list(ev["gpus"])
    return out


def read_announcements(run_dir: str, ranks: list[int]) -> dict[int, dict[str, Any]]:
    """Runs on a node: the last announcement of each of `ranks` there."""
    return {r: a for r in ranks if (a := read_announcement(run_dir, r)) is not None}


def gather_announcements(nodes: Mapping[int, str | None], *, run_dir: str,
                         timeout_s: float) -> dict[int, dict[str, Any]]:
    """The last announcement of each rank (rank -> Ray node id), read on its node: the
    files are on the disk of the host it ran on. A node that does not answer adds nothing."""
    by_node: dict[str, list[int]] = {}
    for rank, nid in nodes.items():
        if nid:
            by_node.setdefault(nid, []).append(rank)
    got = run_on_nodes(read_announcements, {
        nid: {"run_dir": run_dir, "ranks": ranks} for nid, ranks in by_node.items()},
        timeout_s=timeout_s)
    return {r: a for found in got.values() if not isinstance(found, Exception)
            for r, a in found.items()}
