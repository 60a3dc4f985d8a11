"""User-code checkpoints: which reported checkpoint a restart resumes from.

A rank's `meshyard.train.report(metrics, checkpoint=...)` copies the files into
`<run_dir>/checkpoints/step_<08d>/` and reports the step. As in Ray Train, every rank reports
every step; a checkpoint becomes complete — what `meshyard.train.get_checkpoint()` returns in
this and every later attempt — once all ranks of the attempt have reported its step, when
this controller-side tracker writes the `COMPLETE` marker (meshyard/_protocol.py). Each
completed step is then described by `saved_info` (step, path, size, time), which the controller
sends as a `Checkpoints` event: the job's checkpoint list (API, dashboard) shows it like the
built-in loop's.

>>> t = ReportedCheckpoints(root=Path("/tmp/x"), world_size=2, attempt=1, write=lambda p, i: None)
>>> t.observe([{"rank": 0, "step": 1, "checkpoint": "step_00000001"}, {"rank": 1, "step": 1}])
[1]
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from meshyard._protocol import MARKER, step_dir_name
from orchestrator.isolation import runfiles


def write_marker(directory: Path, info: dict[str, Any]) -> None:
    """The marker in a step's folder, which the job's ranks wrote: written beneath the
    checkpoints root without following a link there."""
    runfiles.replace_text(directory.parent, directory / MARKER, json.dumps(info))


MAX_SIZE_ENTRIES = 100_000  # files counted for a checkpoint's size; past it the size is unknown


def size_bytes(directory: Path) -> int | None:
    """The bytes of the regular files under `directory`, links not followed; None when it is
    a link, unreadable, or holds more than MAX_SIZE_ENTRIES entries."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return None
    except OSError:
        return None
    total, seen = 0, 0
    for top, dirs, files in os.walk(directory, followlinks=False):
        for name in (*dirs, *files):
            seen += 1
            if seen > MAX_SIZE_ENTRIES:
                return None
            if name in files:
                try:
                    st = os.lstat(os.path.join(top, name))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


class ReportedCheckpoints:
    def __init__(self, *, root: Path, world_size: int, attempt: int,
                 write: Callable[[Path, dict[str, Any]], None] = write_marker) -> None:
        self._root, self._world, self._attempt, self._write = root, world_size, attempt, write
        self._reported: dict[int, set[int]] = {}  # step -> ranks that reported it
        self._with_files: set[int] = set()  # steps some rank reported a checkpoint for
        self._done: set[int] = set()

    def observe(self, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Feeds metrics rows (rank, step, checkpoint); returns the steps completed now."""
        touched = set()
        for row in rows:
            step, rank = row.get("step"), row.get("rank")
            if not isinstance(step, int) or not isinstance(rank, int) or step in self._done:
                continue
            self._reported.setdefault(step, set()).add(rank)
            if row.get("checkpoint") == step_dir_name(step):
                self._with_files.add(step)
            touched.add(step)
        done = sorted(s for s in touched if s in self._with_files
                      and len(self._reported[s]) >= self._world)
        completed = []
        for step in done:
            try:
                self._write(self._root / step_dir_name(step),
                            {"step": step, "attempt": self._attempt, "ranks": self._world})
            except OSError:
                continue  # the job made its step folder unusable: that step never completes
            self._done.add(step)
            self._reported.pop(step, None)
            completed.append(step)
        return completed

    def saved_info(self, step: int) -> dict[str, Any]:
        """A completed step as the job's checkpoint list records it."""
        path = self._root / step_dir_name(step)
        return {"step": step, "path": str(path), "size_bytes": size_bytes(path),
                "time": time.time()}
