"""Every rank's Python stacks, grouped the way py-spy dump readers expect: ranks whose
threads stand in the same user frames are one group, whatever launched them. Pure module.

Each frame of a stack is one of three kinds:

* ``wrapper``: what starts the code and is the same in every job: runpy, the interpreter's
  frozen bootstrap, thread start-up, Ray's worker, meshyard's runner / prestart / probe and
  the worker actor (workers/host). A rank started warm (meshyard._prestart) and one started
  cold (meshyard.runner) differ only here.
* ``library``: the standard library and installed packages (torch's all_reduce, ...).
* ``user``: everything else: the job's own code (and the built-in loop's, workers/loop).

Stacks are grouped by their user and library frames (file, function, line); the wrapper
frames do not count, and the dashboard folds them away.

>>> groups = group_stacks({0: {"MainThread (training)": "a\\nb"}, 1: {"MainThread (training)":
...                        "a\\nb"}, 2: {"MainThread (training)": "a\\nc"}})
>>> [(g.ranks, g.training) for g in groups]
[((0, 1), True), ((2,), True)]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.text.ranges import format_ranges

TRAINING = "(training)"  # the thread label suffix workers give the training thread
MAX_FRAMES = 400  # frames parsed from one stack; a deeper one keeps its innermost ones

FrameKind = Literal["user", "library", "wrapper"]
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')
# Where the code that starts a rank lives (paths with "/" separators, matched anywhere).
_WRAPPER_PARTS = ("/runpy.py", "<frozen runpy>", "<frozen importlib", "/threading.py",
                  "/concurrent/futures/thread.py", "/site-packages/ray/", "/dist-packages/ray/",
                  "/meshyard/runner.py", "/meshyard/_prestart.py", "/meshyard/_probe.py",
                  "/meshyard/_confine.py", "/workers/host/", "/workers/usercode/")
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "<frozen ", "/lib/python3",
                  "/lib64/python3")


def frame_kind(filename: str) -> FrameKind:
    """What a frame in `filename` is (see the module's doc).

    >>> [frame_kind(f) for f in ("<frozen runpy>", "/venv/lib/python3.12/site-packages/"
    ...  "torch/distributed/distributed_c10d.py", "/code/train.py")]
    ['wrapper', 'library', 'user']
    """
    path = filename.replace("\\", "/")
    if any(p in path for p in _WRAPPER_PARTS):
        return "wrapper"
    if any(p in path for p in _LIBRARY_PARTS):
        return "library"
    return "user"


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str
    code: str  # the source line, as the stack printed it ("" when it had none)
    kind: FrameKind

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "func": self.func, "code": self.code,
                "kind": self.kind}


def parse_frames(text: str) -> list[Frame]:
    """The frames of a stack as `traceback.format_stack` prints it, outermost first; [] when
    the text is not such a stack."""
    frames: list[Frame] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _FRAME_RE.match(line)
        if m is None:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        code = nxt.strip() if nxt.startswith("    ") and not _FRAME_RE.match(nxt) else ""
        frames.append(Frame(file=m["file"], line=int(m["line"]), func=m["func"].strip(),
                            code=code[:300], kind=frame_kind(m["file"])))
    return frames[-MAX_FRAMES:]


def _key(text: str, frames: list[Frame]) -> tuple[Any, ...]:
    """What makes two stacks the same: their frames but the wrapper ones (the text itself
    when it holds no frame)."""
    if not frames:
        return ("text", text.rstrip())
    return tuple((f.file, f.func, f.line) for f in frames if f.kind != "wrapper")


@dataclass(frozen=True)
class StackGroup:
    stack: str
    ranks: tuple[int, ...]
    threads: tuple[str, ...]  # the thread names that run it, across those ranks
    frames: tuple[Frame, ...] = field(default=())

    @property
    def training(self) -> bool:
        return any(t.endswith(TRAINING) for t in self.threads)

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the user's code (else the innermost library frame)."""
        for kind in ("user", "library"):
            found = next((f for f in reversed(self.frames) if f.kind == kind), None)
            if found is not None:
                return found
        return None

    def to_dict(self) -> dict[str, Any]:
        top = self.user_frame
        return {"stack": self.stack, "ranks": list(self.ranks),
                "ranks_text": format_ranges(self.ranks), "threads": list(self.threads),
                "training": self.training, "frames": [f.to_dict() for f in self.frames],
                "user_frame": top.to_dict() if top is not None else None}


def group_stacks(ranks: Mapping[int, Mapping[str, str]]) -> list[StackGroup]:
    """Groups stacks across ranks and threads by their user and library frames (see the
    module's doc). A group shows the stack of its lowest rank. Order: training-thread stacks
    first, then the largest groups (a lone rank elsewhere is often the culprit: it comes
    right after its peers' group)."""
    members: dict[tuple[Any, ...], tuple[str, list[Frame], set[int], set[str]]] = {}
    for rank in sorted(ranks, key=int):
        for thread, text in ranks[rank].items():
            frames = parse_frames(text)
            got = members.setdefault(_key(text, frames), (text.rstrip(), frames, set(), set()))
            got[2].add(int(rank))
            got[3].add(str(thread))
    groups = [StackGroup(stack=text, ranks=tuple(sorted(rs)), threads=tuple(sorted(ts)),
                         frames=tuple(frames))
              for text, frames, rs, ts in members.values()]
    return sorted(groups, key=lambda g: (not g.training, -len(g.ranks), g.ranks, g.threads))


MAX_NATIVE_BYTES = 32 * 1024  # of one rank's py-spy dump (its innermost threads come first)
MAX_NATIVE_GROUPS = 16
# The lines of a py-spy dump that differ between identical ranks: its process and thread
# headers (pids, thread ids) and raw addresses.
_NATIVE_VARYING = re.compile(r"^Process \d+:.*$|^Thread (0x[0-9a-fA-F]+|\d+)|0x[0-9a-fA-F]+",
                             re.MULTILINE)


@dataclass(frozen=True)
class NativeGroup:
    """Ranks whose py-spy dumps (native frames included) read the same but for pids,
    thread ids and addresses; `text` is the lowest rank's dump."""

    ranks: tuple[int, ...]
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "ranks_text": format_ranges(self.ranks),
                "text": self.text}


def group_native(dumps: Mapping[int, str]) -> list[NativeGroup]:
    """py-spy dumps grouped across ranks (largest group first), each cut at MAX_NATIVE_BYTES;
    at most MAX_NATIVE_GROUPS groups (the rest are the least shared)."""
    members: dict[str, tuple[str, list[int]]] = {}
    for rank in sorted(dumps, key=int):
        text = str(dumps[rank])[:MAX_NATIVE_BYTES].rstrip()
        if not text:
            continue
        members.setdefault(_NATIVE_VARYING.sub("#", text), (text, []))[1].append(int(rank))
    groups = sorted((NativeGroup(ranks=tuple(rs), text=text) for text, rs in members.values()),
                    key=lambda g: (-len(g.ranks), g.ranks))
    return groups[:MAX_NATIVE_GROUPS]
