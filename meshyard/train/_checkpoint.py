"""Checkpoint: a directory of files a rank reported (Ray Train's `Checkpoint`, local paths)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshyard._protocol import marker_info


@dataclass(frozen=True)
class Checkpoint:
    path: str

    @classmethod
    def from_directory(cls, path: str | Path) -> Checkpoint:
        p = Path(path)
        if not p.is_dir():
            raise ValueError(f"checkpoint directory {str(p)!r} does not exist")
        return cls(path=str(p.resolve()))

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        """The checkpoint's files, in place (read them; do not change them)."""
        yield self.path

    def to_directory(self, path: str | Path | None = None) -> str:
        """Copies the files to `path` (default: a new temporary directory); returns it."""
        dest = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="ckpt-"))
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return str(dest)

    def get_metadata(self) -> dict[str, Any]:
        """What meshyard recorded when the checkpoint became complete (step, attempt)."""
        return marker_info(Path(self.path))
