"""Grouping of per-rank failures, so 64 ranks do not print 64 traces. Pure module.

Two errors are the same when their type and message match after numbers, hex ids and
addresses are normalised:

>>> groups = group_failures([
...     {"rank": 3, "node": "n1", "error_type": "RuntimeError", "message": "rank 3 lost peer 1"},
...     {"rank": 5, "node": "n2", "error_type": "RuntimeError", "message": "rank 5 lost peer 1"},
... ])
>>> [(g.signature, g.ranks) for g in groups]
[('RuntimeError: rank <N> lost peer <N>', (3, 5))]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_PATTERNS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<HEX>"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<ID>"),
    (re.compile(r"\[?\b\d{1,3}(\.\d{1,3}){3}\b\]?(:\d+)?"), "<ADDR>"),
    (re.compile(r"\d+(\.\d+)?"), "<N>"),
)


def normalise(message: str) -> str:
    """The message with volatile parts (numbers, ids, addresses) replaced by placeholders."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    for pattern, repl in _PATTERNS:
        first = pattern.sub(repl, first)
    return first[:500]


@dataclass(frozen=True)
class FailureGroup:
    signature: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    example: str  # one full message, for the reader
    traceback: str  # one traceback tail (the first rank's)

    def to_dict(self) -> dict[str, Any]:
        return {"signature": self.signature, "ranks": list(self.ranks), "nodes": list(self.nodes),
                "count": len(self.ranks), "example": self.example, "traceback": self.traceback}


def group_failures(failures: Iterable[Mapping[str, Any]]) -> list[FailureGroup]:
    """Groups rank failures ({rank, node, error_type, message, traceback?}); the group holding
    the earliest failure comes first (it is usually the cause; the others are fallout)."""
    order: list[str] = []
    members: dict[str, list[Mapping[str, Any]]] = {}
    for f in failures:
        sig = f"{f.get('error_type') or 'Error'}: {normalise(str(f.get('message', '')))}"
        if sig not in members:
            order.append(sig)
            members[sig] = []
        members[sig].append(f)
    out = []
    for sig in order:
        fs = members[sig]
        ranks = tuple(sorted(int(f["rank"]) for f in fs))
        nodes = tuple(sorted({str(f.get("node") or "?") for f in fs}))
        tb = str(fs[0].get("traceback") or "")
        out.append(FailureGroup(signature=sig, ranks=ranks, nodes=nodes,
                                example=str(fs[0].get("message", ""))[:2000],
                                traceback=tb[-4000:]))
    return out


def summarise(groups: list[FailureGroup]) -> str:
    """One line per group: 'rank 1 on n2: RuntimeError: boom' or '62 ranks (0-61) on 8 nodes'."""
    lines = []
    for g in groups:
        who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else \
            f"{len(g.ranks)} ranks ({_ranges(g.ranks)})"
        where = g.nodes[0] if len(g.nodes) == 1 else f"{len(g.nodes)} nodes"
        lines.append(f"{who} on {where}: {g.signature}")
    return "; ".join(lines)


def _ranges(ranks: tuple[int, ...]) -> str:
    parts: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:] + (None,):  # type: ignore[operator]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def nodes_failed_twice(failed_nodes_per_attempt: Iterable[Iterable[str]]) -> set[str]:
    """Nodes that appear in the failures of two or more attempts (to avoid on restart)."""
    counts: dict[str, int] = {}
    for nodes in failed_nodes_per_attempt:
        for n in set(nodes):
            counts[n] = counts.get(n, 0) + 1
    return {n for n, c in counts.items() if c >= 2}
