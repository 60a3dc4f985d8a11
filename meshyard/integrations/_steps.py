"""One report per step: a framework logs a step's values in several calls (train, then
validation) and saves its checkpoint after them; `StepReports` merges them and reports each
step once (meshyard.train.report), the checkpoint with it. Every rank must report a step for
its checkpoint to complete, so ranks that log nothing report the step with no values."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshyard.train import Checkpoint, report


def _number(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        v = v.item()
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return v if not isinstance(v, float) or math.isfinite(v) else None
    return None


class StepReports:
    def __init__(self) -> None:
        self.step: int | None = None
        self.values: dict[str, Any] = {}
        self.reported: int | None = None  # the last step reported

    def add(self, values: Mapping[str, Any], step: int) -> None:
        """Values logged at `step`; an earlier step's are reported first."""
        if self.step is not None and step != self.step:
            self.flush()
        self.step = step
        for k, v in values.items():
            n = _number(v)
            if n is not None:
                self.values[str(k).replace("/", "_")] = n

    def flush(self, checkpoint: Checkpoint | None = None) -> None:
        if self.step is None or (self.step == self.reported and checkpoint is None
                                 and not self.values):
            return
        report({**self.values, "step": self.step}, checkpoint=checkpoint)
        self.reported, self.values = self.step, {}

    def checkpoint(self, step: int, path: Path | None) -> None:
        """Reports `step` with the file or directory at `path` (None on ranks that saved
        nothing) as its checkpoint."""
        if self.step is not None and self.step != step:
            self.flush()
        self.step = step
        if path is None:
            self.flush()
        elif path.is_dir():
            self.flush(Checkpoint.from_directory(path))
        else:  # a single file (Lightning's .ckpt): reported as a directory holding it
            with tempfile.TemporaryDirectory(prefix="meshyard-ckpt-") as tmp:
                shutil.copy2(path, Path(tmp) / path.name)
                self.flush(Checkpoint.from_directory(tmp))
