"""Parser for NCCL_DEBUG, PyTorch (ProcessGroupNCCL watchdog, desync debug, heartbeat
monitor, ProcessGroupWrapper) and gloo log lines. Pure module (stdlib only).

`parse_text(text)` returns `LogEvent`s; `event.to_dict()` is the CLI contract
(`meshyard logs parse FILE --json`): a `kind` plus flat fields. Each line loses its terminal
escape codes (`orchestrator.text.ansi`), lines where two NCCL writers collided are split back into
records, and each record loses what launchers and log shippers put before it (`log_prefixes`:
Ray, mpirun, torchrun, Slurm, Kubernetes, Loki, timestamps, in any chain), keeping the ranks
they name. An NCCL record is then found by its own structure wherever it starts
(`log_patterns`), PyTorch and gloo messages by their anchors, whole or cut (`log_torch`; a cut
message is `partial`). Multi-line reports (desync debug, NCCL RAS, Flight Recorder analyzer
output, torchrun's failure summary) are assembled by small state machines in `log_blocks`.
Every step is linear in the input's length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestrator.text.ansi import strip_ansi
from orchestrator.watchdog import log_blocks, log_patterns
from orchestrator.watchdog.log_prefixes import strip_decorations


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


# Where an NCCL / PyTorch record starts: a second one in a physical line is a second writer.
_NCCL_START_RE = re.compile(r"(?<![\w.\-])[\w.\-]+:\d+:\d+ \[\d+\] (?:\d+\.\d+ )?"
                            r"(?:[\w./\-]+:\d+ )?NCCL ")
_TORCH_START_RE = re.compile(r"\[rank\d+\]:\[[EWIF]")


def strip_prefixes(line: str) -> tuple[str, dict[str, Any]]:
    """Remove launcher / terminal decorations; return the payload and what they said."""
    return strip_decorations(strip_ansi(line))


def _split_at(line: str, rx: re.Pattern[str], *, after_space: bool) -> list[str]:
    """Cut `line` where a second, third ... record starts (the first keeps the prefix)."""
    cuts = [m.start() for m in rx.finditer(line)][1:]
    cuts = [c for c in cuts if line[c - 1].isspace() == after_space]
    bounds = [0, *cuts, len(line)]
    parts = [line[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return [p.rstrip() for p in parts[:-1]] + parts[-1:]


def split_records(line: str) -> list[str]:
    """One physical line -> records (concurrent writers can glue two records together)."""
    out = []
    for p in _split_at(line, _NCCL_START_RE, after_space=True):
        out += _split_at(p, _TORCH_START_RE, after_space=False)
    return [p for p in out if p.strip()]


def parse_lines(lines: Iterable[str]) -> list[LogEvent]:
    events: list[LogEvent] = []
    blocks = log_blocks.BlockParsers()
    no = 0
    for no, physical in enumerate(lines, 1):
        for record in split_records(strip_ansi(physical)):
            payload, meta = strip_decorations(record)
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


ERROR_KINDS = frozenset({"nccl_warn", "torch_watchdog_timeout", "gloo_timeout",
                         "collective_mismatch", "heartbeat_stuck", "heartbeat_timeout",
                         "monitored_barrier_failure", "rank_exited"})


def errors_by_rank(events: Iterable[LogEvent]) -> dict[int, list[str]]:
    """Error-ish events per rank (rank field, else launcher rank) for the analyzer."""
    kinds = ERROR_KINDS
    out: dict[int, list[str]] = {}
    for e in events:
        if e.kind not in kinds:
            continue
        r = e.get("rank", e.get("launcher_rank"))
        if isinstance(r, int):
            out.setdefault(r, []).append(e.describe())
    return out
