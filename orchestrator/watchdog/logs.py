"""Parser for NCCL_DEBUG, PyTorch (ProcessGroupNCCL watchdog, desync debug, heartbeat
monitor, ProcessGroupWrapper) and gloo log lines. Pure module (stdlib only).

`parse_text(text)` returns `LogEvent`s; `event.to_dict()` is the CLI contract
(`meshyard logs parse FILE --json`): a `kind` plus flat fields. Lines are first stripped of
what launchers and terminals add — ANSI colour (also the ESC-less residue "[36m"), a log
viewer's "[80746] ", Ray's "(Actor pid=1, ip=...)" and "[repeated 14x across cluster]",
mpirun's "[1,3]<stdout>:", torchrun's "[rank3]:", "[name|3]:", timestamps, glog headers —
and lines where two NCCL writers collided are split back into records. Multi-line reports
(desync debug, NCCL RAS, Flight Recorder analyzer output) are assembled by small state
machines in `log_blocks`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestrator.watchdog import log_blocks, log_patterns


@dataclass(frozen=True)
class LogEvent:
    kind: str
    line_no: int
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "line": self.line_no, **self.fields}

    def describe(self) -> str:
        msg = self.fields.get("message")
        return f"{self.kind}: {msg}" if msg else f"{self.kind}: " + ", ".join(
            f"{k}={v}" for k, v in self.fields.items() if v is not None and k != "raw")


_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|^\[\d{1,3}(?:;\d{1,3})*m")
_VIEWER_RE = re.compile(r"^\[(\d+)\] (?=\S)")
_RAY_RE = re.compile(r"^\((?P<actor>[\w.\-]+) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9a-fA-F.:]+))?"
                     r"(?:, [^)]*)?\)\s*")
_MPI_RE = re.compile(r"^\[(?P<job>\d+),(?P<rank>\d+)\]<(?:stdout|stderr)>:\s*")
_TORCHRUN_RE = re.compile(r"^\[(?:rank|default)(?P<rank>\d+)\]:\s?")
_NAMED_RE = re.compile(r"^\[(?P<name>[\w.\-]+)\|(?P<rank>\d+)\]:\s?")
_REPEAT_RE = re.compile(r"\s*\[repeated (\d+)x across cluster\]\s*$")
_TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
                    r"(?: ?[|:-](?=\s))?\s*(?=\S)")
# Where a second NCCL record starts inside one physical line (two writers, one line).
_NCCL_SPLIT_RE = re.compile(r"(?<=\S)\s+(?=[\w.\-]+:\d+:\d+ \[\d+\] (?:[\w./]+:\d+ )?NCCL )")
_TORCH_SPLIT_RE = re.compile(r"(?<=\S)(?=\[rank\d+\]:\[[EWIF])")


def strip_prefixes(line: str) -> tuple[str, dict[str, Any]]:
    """Remove launcher / terminal decorations; return the payload and what they said."""
    meta: dict[str, Any] = {}
    s = _ANSI_RE.sub("", line.rstrip("\r\n"))
    m = _REPEAT_RE.search(s)
    if m:
        meta["repeated"] = int(m.group(1))
        s = s[: m.start()]
    if m := _VIEWER_RE.match(s):  # only at column 0: indented "[7] finished ..." is a report
        s = s[m.end():]
    for _ in range(6):  # prefixes nest: "(Actor pid=1, ip=...) [rank0]:[E...]"
        before = s
        s = s.lstrip()
        if m := _RAY_RE.match(s):
            meta.update(actor=m.group("actor"), actor_pid=int(m.group("pid")))
            if m.group("ip"):
                meta["ip"] = m.group("ip")
            s = s[m.end():]
        if m := _MPI_RE.match(s):
            meta["launcher_rank"] = int(m.group("rank"))
            s = s[m.end():]
        if m := _TORCHRUN_RE.match(s):
            meta["launcher_rank"] = int(m.group("rank"))
            s = s[m.end():]
        if m := _NAMED_RE.match(s):
            meta.update(launcher_rank=int(m.group("rank")), launcher_name=m.group("name"))
            s = s[m.end():]
        if m := _TS_RE.match(s):
            s = s[m.end():]
        if s == before:
            break
    return s, meta


def split_records(line: str) -> list[str]:
    """One physical line -> records (concurrent writers can glue two records together)."""
    parts = _NCCL_SPLIT_RE.split(line)
    out = []
    for p in parts:
        out += _TORCH_SPLIT_RE.split(p)
    return [p for p in out if p.strip()]


def parse_lines(lines: Iterable[str]) -> list[LogEvent]:
    events: list[LogEvent] = []
    blocks = log_blocks.BlockParsers()
    no = 0
    for no, physical in enumerate(lines, 1):
        for record in split_records(physical):
            payload, meta = strip_prefixes(record)
            for kind, fields in blocks.feed(payload, meta):
                events.append(LogEvent(kind, no, fields))
            if blocks.consumed:
                continue
            for kind, fields in log_patterns.match(payload, meta):
                events.append(LogEvent(kind, no, {**_public(meta), **fields}))
    for kind, fields in blocks.flush():
        events.append(LogEvent(kind, no, fields))
    return events


def _public(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if v is not None}


def parse_text(text: str) -> list[LogEvent]:
    return parse_lines(text.splitlines())


def errors_by_rank(events: Iterable[LogEvent]) -> dict[int, list[str]]:
    """Error-ish events per rank (rank field, else launcher rank) for the analyzer."""
    kinds = {"nccl_warn", "torch_watchdog_timeout", "gloo_timeout", "collective_mismatch",
             "heartbeat_stuck", "heartbeat_timeout", "monitored_barrier_failure"}
    out: dict[int, list[str]] = {}
    for e in events:
        if e.kind not in kinds:
            continue
        r = e.get("rank", e.get("launcher_rank"))
        if isinstance(r, int):
            out.setdefault(r, []).append(e.describe())
    return out
