"""report() and get_checkpoint(): the rank's side of meshyard's reporting channel.

Under meshyard each record is one JSON line appended to MESHYARD_REPORT_FILE (the worker
actor tails it); a checkpoint is copied into the job's checkpoint dir first. Outside meshyard
reports stay in this process (get_checkpoint returns the last one reported).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshyard import _protocol as proto
from meshyard.train._checkpoint import Checkpoint
from meshyard.train._context import get_context

MAX_KEYS = 64


class _Channel:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.file = os.environ.get(proto.REPORT_FILE) or None
        root = os.environ.get(proto.CHECKPOINT_DIR)
        self.root = Path(root) if root else None
        self.refused = os.environ.get(proto.CHECKPOINT_REFUSED) or None
        self.last: Checkpoint | None = None
        start = latest_checkpoint(self.root)
        info = start.get_metadata() if start is not None else {}
        self.count = int(info.get("step", 0))  # reports without a step continue from here

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        line = json.dumps(record, allow_nan=False)
        if len(line) > proto.MAX_RECORD_CHARS:
            raise ValueError(f"report of {len(line)} characters; at most "
                             f"{proto.MAX_RECORD_CHARS}: report numbers, not data")
        with open(self.file, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def save(self, step: int, checkpoint: Checkpoint) -> str | None:
        if self.refused:
            raise RuntimeError(f"meshyard cannot keep this checkpoint: {self.refused}")
        if self.root is None:
            return None
        dest = self.root / proto.step_dir_name(step)
        src = Path(checkpoint.path).resolve()
        if src != dest.resolve():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        return dest.name


_STATE: list[_Channel] = []


def _channel() -> _Channel:
    if not _STATE:
        _STATE.append(_Channel())
    return _STATE[0]


def latest_checkpoint(root: Path | None) -> Checkpoint | None:
    found = proto.complete_checkpoints(root) if root is not None else []
    return Checkpoint(path=str(found[-1][1])) if found else None


def _value(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):  # torch / numpy scalars
        v = v.item()
    if isinstance(v, bool) or v is None or isinstance(v, int | str):
        return v if not isinstance(v, str) else v[:200]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return str(v)[:200]


def report(metrics: Mapping[str, Any], checkpoint: Checkpoint | None = None) -> None:
    """Reports this rank's metrics (and optionally a checkpoint) for one step.

    `metrics["step"]`, when present, is the step; otherwise reports are counted (continuing
    from the checkpoint a restart resumed from). Every numeric value is stored and charted:
    `loss`, `grad_norm`, `step_time_s` and `tokens_per_s` like the built-in loop's, any other
    key in a chart of its own (`val_X` / `eval_X` drawn against `X`); a job keeps at most 64
    such names of 1-64 letters, digits and `_ . : / -` (the service drops the rest and says
    so in a job event).
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
    if len(metrics) > MAX_KEYS:
        raise ValueError(f"{len(metrics)} metrics in one report; at most {MAX_KEYS}")
    ch = _channel()
    with ch.lock:
        step = int(metrics["step"]) if "step" in metrics else ch.count + 1
        if step < 0:
            raise ValueError(f"step {step} is negative")
        ch.count = step
        name = ch.save(step, checkpoint) if checkpoint is not None else None
        if checkpoint is not None:
            ch.last = checkpoint
        ch.write({"kind": "report", "rank": get_context().world_rank, "step": step,
                  "time": time.time(), "checkpoint": name,
                  "metrics": {str(k)[:64]: _value(v) for k, v in metrics.items()}})


def get_checkpoint() -> Checkpoint | None:
    """The newest complete checkpoint of this job (None on a fresh start); outside meshyard,
    the last one this process reported."""
    ch = _channel()
    found = latest_checkpoint(ch.root)
    return found if found is not None or ch.root is not None else ch.last
