"""Per-node hang evidence: `nvidia-smi -q` (Xid errors, ECC, NVLink state) once per node of a
GPU job, from a Ray task pinned to that node, into the round's `node-<name>/` folder."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.watchdog.evidence_files import PathLike, node_dir


def collect_node_evidence(run_dir: PathLike, *, stamp: str, node: str | None = None,
                          timeout_s: float = 20.0) -> list[str]:
    """Runs on the node. Returns the artifact paths; nothing without nvidia-smi (CPU nodes)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
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
    return [str(path)]


def gather_node_evidence(nodes: Mapping[str, str | None], *, run_dir: str, stamp: str,
                         timeout_s: float) -> list[str]:
    """`collect_node_evidence` on every node (Ray node id -> node name); a node that does not
    answer in time adds nothing (the rest of the round must not wait on it)."""
    task: Any = ray.remote(num_cpus=0)(collect_node_evidence)  # type: ignore[arg-type]
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False))
            .remote(run_dir, stamp=stamp, node=name) for nid, name in nodes.items()]
    out: list[str] = []
    for ref in refs:
        try:
            out.extend(ray.get(ref, timeout=timeout_s))
        except Exception:  # noqa: BLE001 - a missing nvidia-smi dump is not fatal
            continue
    return out

