"""The contract between a worker actor and the rank process it starts. Stdlib only.

Environment (set by the worker, read by the runner and `meshyard.train`):

    MESHYARD_REPORT_FILE      per-rank JSON-lines file the rank appends records to
    MESHYARD_CHECKPOINT_DIR   checkpoints of the job, kept across attempts
    MESHYARD_MESH_DIM_NAMES   "pp,dp_replicate,dp_shard,ep,cp,tp"
    MESHYARD_MESH_SHAPE       "1,1,4,1,1,8" (same order)
    MESHYARD_ZERO_STAGE       effective ZeRO stage (0, 2, 3) for prepare_model
    MESHYARD_INIT_TIMEOUT_S   process-group init timeout (function entrypoints)
    MESHYARD_PARENT_PID       the worker actor's pid (the rank dies with it)
    MESHYARD_FUNCTION_CONFIG  file holding the function's `config` as JSON
    MESHYARD_PROBE_DIR        where the hang watchdog's probe in the rank writes its progress
                              and answers evidence requests (meshyard/_probe.py)

Records (one JSON object per line in MESHYARD_REPORT_FILE):

    {"kind": "report", "step": 3, "time": 1.7e9, "metrics": {...}, "checkpoint": "step_00000003"}
    {"kind": "error", "type": "ValueError", "message": "...", "traceback": "...", "setup": false}

A reported checkpoint is copied to `<MESHYARD_CHECKPOINT_DIR>/step_<08d step>/`; it becomes the
one a restart resumes from once every rank has reported that step, when the attempt's
controller writes `COMPLETE` (JSON: step, attempt) into it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT_FILE = "MESHYARD_REPORT_FILE"
CHECKPOINT_DIR = "MESHYARD_CHECKPOINT_DIR"
MESH_DIM_NAMES = "MESHYARD_MESH_DIM_NAMES"
MESH_SHAPE = "MESHYARD_MESH_SHAPE"
ZERO_STAGE = "MESHYARD_ZERO_STAGE"
INIT_TIMEOUT_S = "MESHYARD_INIT_TIMEOUT_S"
PARENT_PID = "MESHYARD_PARENT_PID"
FUNCTION_CONFIG = "MESHYARD_FUNCTION_CONFIG"
JOB_ID = "MESHYARD_JOB_ID"
ATTEMPT = "MESHYARD_ATTEMPT"
PROBE_DIR = "MESHYARD_PROBE_DIR"

MARKER = "COMPLETE"
MAX_RECORD_CHARS = 64 * 1024


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
