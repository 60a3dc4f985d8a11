"""The contract between a worker actor and the rank process it starts. Stdlib only.

Environment (set by the worker, read by the runner and `meshyard.train`):

    MESHYARD_REPORT_FILE      per-rank JSON-lines file the rank appends records to
    MESHYARD_CHECKPOINT_DIR   checkpoints of the job, kept across attempts
    MESHYARD_CHECKPOINT_REFUSED  set instead when the ranks landed on several hosts and the
                              checkpoints would go to host-local disks: why, and the setting
                              to give; a report with a checkpoint raises it
    MESHYARD_MESH_DIM_NAMES   "pp,dp_replicate,dp_shard,ep,cp,tp"
    MESHYARD_MESH_SHAPE       "1,1,4,1,1,8" (same order)
    MESHYARD_ZERO_STAGE       effective ZeRO stage (0, 2, 3) for prepare_model
    MESHYARD_INIT_TIMEOUT_S   process-group init timeout (function entrypoints)
    MESHYARD_PARENT_PID       the worker actor's pid (the rank dies with it)
    MESHYARD_FUNCTION_CONFIG  file holding the function's `config` as JSON
    MESHYARD_PROBE_DIR        where the hang watchdog's probe in the rank writes its progress
                              and answers evidence requests (meshyard/_probe.py)
    MESHYARD_STOP_FILE        exists once the worker asked the rank to stop (a preemption or
                              a cancel): `get_context().should_stop()` is true, SIGTERM follows
                              and SIGKILL after the grace period

Records (one JSON object per line in MESHYARD_REPORT_FILE):

    {"kind": "report", "step": 3, "time": 1.7e9, "metrics": {...}, "checkpoint": "step_00000003"}
    {"kind": "error", "type": "ValueError", "message": "...", "traceback": "...", "setup": false}

A reported checkpoint is copied to `<MESHYARD_CHECKPOINT_DIR>/step_<08d step>/`; it becomes the
one a restart resumes from once every rank has reported that step, when the attempt's
controller writes `COMPLETE` (JSON: step, attempt) into it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

REPORT_FILE = "MESHYARD_REPORT_FILE"
CHECKPOINT_DIR = "MESHYARD_CHECKPOINT_DIR"
CHECKPOINT_REFUSED = "MESHYARD_CHECKPOINT_REFUSED"
MESH_DIM_NAMES = "MESHYARD_MESH_DIM_NAMES"
MESH_SHAPE = "MESHYARD_MESH_SHAPE"
ZERO_STAGE = "MESHYARD_ZERO_STAGE"
INIT_TIMEOUT_S = "MESHYARD_INIT_TIMEOUT_S"
PARENT_PID = "MESHYARD_PARENT_PID"
FUNCTION_CONFIG = "MESHYARD_FUNCTION_CONFIG"
JOB_ID = "MESHYARD_JOB_ID"
ATTEMPT = "MESHYARD_ATTEMPT"
PROBE_DIR = "MESHYARD_PROBE_DIR"
STOP_FILE = "MESHYARD_STOP_FILE"

MARKER = "COMPLETE"

# The hang watchdog's probe (meshyard/_probe.py) and its reader (orchestrator/watchdog/
# probe_files.py, the CLI's `meshyard watch`): files in MESHYARD_PROBE_DIR, per rank, and in
# the answer folder a request names.
PROGRESS_SUFFIX = ".progress.json"
REQUEST_SUFFIX = ".request"
ANSWER_FILE = "probe.json"
STACKS_FILE = "stacks.txt"
FR_TRACE_FILE = "fr_trace.pkl"
PYSPY_FILE = "pyspy.txt"


def progress_path(probe_dir: str | Path, rank: int) -> Path:
    """The file a rank's probe rewrites when its collective counters move."""
    return Path(probe_dir) / f"rank{rank}{PROGRESS_SUFFIX}"


def stop_path(probe_dir: str | Path, rank: int) -> Path:
    """The file whose existence asks a rank to stop (MESHYARD_STOP_FILE)."""
    return Path(probe_dir) / f"rank{rank}.stop"


def request_path(probe_dir: str | Path, rank: int) -> Path:
    """The file a watcher writes to ask a rank's probe for evidence (JSON: id, out)."""
    return Path(probe_dir) / f"rank{rank}{REQUEST_SUFFIX}"
MAX_RECORD_CHARS = 64 * 1024


def pyspy_path() -> str | None:
    """The py-spy binary: on PATH, else beside this interpreter (a virtualenv's bin, which a
    rank's PATH may lack); None when it is not installed."""
    found = shutil.which("py-spy")
    if found is None:
        beside = Path(sys.executable).parent / "py-spy"
        found = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None
    return found


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under `root`, newest last."""
    r = Path(root)
    if not r.is_dir():
        return []
    out = []
    for d in r.glob("step_*"):
        try:
            info = json.loads((d / MARKER).read_text())
            out.append((int(info["step"]), d))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out)


def marker_info(directory: Path) -> dict[str, Any]:
    try:
        info = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}
