"""Per-rank stdout / stderr capture at the file-descriptor level.

Why descriptors and not sys.stdout: gloo, NCCL and other C++ code write to fd 1 / 2 directly.
The files are the durable copy (under the run dir, mode 0600); a tail thread also hands each
complete line to `sink(stream, line)` so the controller can forward logs to the control plane.
A user-code rank writes in the same run dir, so the files are opened beneath it without
following a link (orchestrator/isolation/runfiles.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from orchestrator.isolation import runfiles

_TAIL_INTERVAL_S = 0.2
_MAX_LINE = 8192


def private_opener(path: str, flags: int) -> int:
    """`open(..., opener=private_opener)`: a new file readable by its owner only (0600); run
    logs carry a job's output, which other users of the machine have no business reading.
    A symbolic link in its place is refused (ELOOP), never written through."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


class LineTail:
    """New complete lines of a growing file since the last read (from its size at creation);
    `read(final=True)` also returns a last line without its newline."""

    def __init__(self, path: Path, *, beneath: str | os.PathLike[str],
                 from_start: bool = False, max_read: int = 4 * 2**20) -> None:
        self.path, self.root, self.max_read = path, beneath, max_read
        self._offset = 0
        if not from_start:
            with contextlib.suppress(OSError):
                self._offset = runfiles.size(beneath, path)
        self._partial = ""

    def read(self, *, final: bool = False, max_line: int = _MAX_LINE) -> list[str]:
        try:
            data = runfiles.read_bytes(self.root, self.path, max_bytes=self.max_read,
                                       offset=self._offset)
        except OSError:
            return []
        self._offset += len(data)
        lines = (self._partial + data.decode("utf-8", errors="replace")).split("\n")
        self._partial = "" if final else lines.pop()
        return [line[:max_line] for line in lines if line or not final]


class LogCapture:
    def __init__(self, *, stdout: Path, stderr: Path, beneath: str | os.PathLike[str],
                 sink: Callable[[str, str], None]) -> None:
        self._paths = {"stdout": stdout, "stderr": stderr}
        self._root = beneath
        self._sink = sink
        self._saved: dict[int, int] = {}
        self._tails: dict[str, LineTail] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        _flush_std()
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            path = self._paths[stream]
            self._tails[stream] = LineTail(path, beneath=self._root)
            target = runfiles.open_write(self._root, path, append=True)
            self._saved[fd] = os.dup(fd)
            os.dup2(target, fd)
            os.close(target)
        self._thread = threading.Thread(target=self._tail, name="meshyard-logtail", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        _flush_std()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()
        self._read_all(final=True)

    def _tail(self) -> None:
        while not self._stop.wait(_TAIL_INTERVAL_S):
            _flush_std()
            self._read_all(final=False)

    def _read_all(self, *, final: bool) -> None:
        for stream, tail in self._tails.items():
            for line in tail.read(final=final):
                self._sink(stream, line)


def _flush_std() -> None:
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            s.flush()


def unseen_tail(path: str, anchor: list[str], *, beneath: str,
                max_bytes: int = 256 * 1024) -> list[str]:
    """The lines at the end of a rank's log file that came after `anchor` (the last lines the
    controller received): what a process wrote just before it died, which its tail thread
    never handed on. Reads at most the last `max_bytes`; an anchor it cannot find there
    means everything read is new.

    >>> import tempfile, os
    >>> f = tempfile.NamedTemporaryFile("w", delete=False); _ = f.write("a\\nb\\nc\\nd\\n")
    >>> f.close(); d = os.path.dirname(f.name)
    >>> unseen_tail(f.name, ["a", "b"], beneath=d), unseen_tail(f.name, [], beneath=d)
    (['c', 'd'], ['a', 'b', 'c', 'd'])
    >>> os.unlink(f.name)
    """
    try:
        size = runfiles.size(beneath, path)
        data = runfiles.tail(beneath, path, max_bytes=max_bytes)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").split("\n")
    if size > max_bytes:
        lines = lines[1:]  # the first one is cut
    if lines and lines[-1] == "":
        lines.pop()
    n = len(anchor)
    for i in range(len(lines) - n, -1, -1):
        if n and lines[i:i + n] == anchor:
            return [x[:_MAX_LINE] for x in lines[i + n:]]
    return [x[:_MAX_LINE] for x in lines]
