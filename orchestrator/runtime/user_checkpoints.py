"""User-code checkpoints: which reported checkpoint a restart resumes from.

A rank's `meshyard.train.report(metrics, checkpoint=...)` copies the files into
`<run_dir>/checkpoints/step_<08d>/` and reports the step. As in Ray Train, every rank reports
every step; a checkpoint becomes complete — what `meshyard.train.get_checkpoint()` returns in
this and every later attempt — once all ranks of the attempt have reported its step, when
this controller-side tracker writes the `COMPLETE` marker (meshyard/_protocol.py).

>>> t = ReportedCheckpoints(root=Path("/tmp/x"), world_size=2, attempt=1, write=lambda p, i: None)
>>> t.observe([{"rank": 0, "step": 1, "checkpoint": "step_00000001"}, {"rank": 1, "step": 1}])
[1]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from meshyard._protocol import MARKER, step_dir_name


def write_marker(directory: Path, info: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(info))
    tmp.replace(directory / MARKER)


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
        for step in done:
            self._write(self._root / step_dir_name(step),
                        {"step": step, "attempt": self._attempt, "ranks": self._world})
            self._done.add(step)
            self._reported.pop(step, None)
        return done
