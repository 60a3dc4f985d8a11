"""Grouping of per-rank failures, so 64 ranks do not print 64 traces. Pure module.

Two errors are the same when their type and message match after numbers, hex ids and
addresses are normalised:

>>> groups = group_failures([
...     RankFailure(rank=3, node="n1", error_type="RuntimeError", message="rank 3 lost peer 1"),
...     RankFailure(rank=5, node="n2", error_type="RuntimeError", message="rank 5 lost peer 1"),
... ])
>>> [(g.signature, g.ranks) for g in groups]
[('RuntimeError: rank <N> lost peer <N>', (3, 5))]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.lifecycle import Reason
from orchestrator.ranges import format_ranges
from orchestrator.watchdog.report import DiagnosisReport, Verdict

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
class RankFailure:
    """One rank's failure as the controller saw it: its run raised, or its process died
    (error_type WorkerDied). `time` orders failures: the first one is usually the cause."""

    rank: int
    error_type: str
    message: str
    node: str | None = None
    node_id: str | None = None
    traceback: str = ""
    time: float = 0.0
    setup_error: bool = False  # user code that could not load (its import failed, ...)
    exit_code: int | None = None  # user code: the rank process's exit status (-N: signal N)

    @property
    def died(self) -> bool:
        return self.error_type == "WorkerDied"


@dataclass(frozen=True)
class FailureGroup:
    signature: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    example: str  # one full message, for the reader
    traceback: str  # one traceback tail (the first rank's)
    exit_codes: tuple[tuple[int, int], ...] = ()  # (rank, exit status) of user-code ranks

    def to_dict(self) -> dict[str, Any]:
        out = {"signature": self.signature, "ranks": list(self.ranks), "nodes": list(self.nodes),
               "count": len(self.ranks), "example": self.example, "traceback": self.traceback}
        if self.exit_codes:
            out["exit_codes"] = {str(r): c for r, c in self.exit_codes}
        return out

    def exit_text(self) -> str:
        """' (exit code 3)', ' (exit codes 1, 3)', or '' for ranks without one."""
        codes = sorted({c for _, c in self.exit_codes})
        if not codes:
            return ""
        return f" (exit code{'s' if len(codes) > 1 else ''} {', '.join(map(str, codes))})"


def group_failures(failures: Iterable[RankFailure]) -> list[FailureGroup]:
    """Groups rank failures, in the order given (earliest first: the group holding the
    earliest failure comes first; it is usually the cause, the others are fallout)."""
    order: list[str] = []
    members: dict[str, list[RankFailure]] = {}
    for f in failures:
        sig = f"{f.error_type or 'Error'}: {normalise(f.message)}"
        if sig not in members:
            order.append(sig)
            members[sig] = []
        members[sig].append(f)
    out = []
    for sig in order:
        fs = members[sig]
        ranks = tuple(sorted(f.rank for f in fs))
        nodes = tuple(sorted({f.node or "?" for f in fs}))
        codes = tuple(sorted((f.rank, f.exit_code) for f in fs if f.exit_code is not None))
        out.append(FailureGroup(signature=sig, ranks=ranks, nodes=nodes,
                                example=fs[0].message[:2000], traceback=fs[0].traceback[-4000:],
                                exit_codes=codes))
    return out


def summarise(groups: list[FailureGroup]) -> str:
    """One line per group: 'rank 1 on n2: RuntimeError: boom' or '62 ranks (0-61) on 8 nodes'."""
    lines = []
    for g in groups:
        who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else \
            f"{len(g.ranks)} ranks ({format_ranges(g.ranks)})"
        where = g.nodes[0] if len(g.nodes) == 1 else f"{len(g.nodes)} nodes"
        lines.append(f"{who} on {where}: {g.signature}{g.exit_text()}")
    return "; ".join(lines)


def cause_first(failures: Iterable[RankFailure], culprits: Iterable[int] = ()
                ) -> list[RankFailure]:
    """The diagnosis' culprits first, then ranks whose process died, then by time: a peer's
    "Connection reset by peer" often reaches the controller before the death it reports."""
    named = set(culprits)
    return sorted(failures, key=lambda f: (f.rank not in named, not f.died, f.time, f.rank))


@dataclass(frozen=True)
class AttemptFailed:
    """How a failed attempt is reported: reason, message (the cause first), grouped errors."""

    reason: Reason
    message: str
    groups: tuple[FailureGroup, ...]


def attempt_failed(failures: Iterable[RankFailure],
                   cause: DiagnosisReport | None = None) -> AttemptFailed:
    """The failure of an attempt whose ranks ended with errors. With an open diagnosis (a
    hang the watchdog reported, or a rank's exit) the reason and message come from it, and
    the errors that followed (the peers' timeouts) come after:

    >>> r = DiagnosisReport(verdict=Verdict.NOT_JOINED, culprit_ranks=(1,), confidence=0.9,
    ...                     summary="Rank 1 never entered all_reduce #15.")
    >>> f = attempt_failed([RankFailure(rank=0, error_type="RuntimeError", message="timeout")],
    ...                    r)
    >>> f.reason.value
    'HANG_DETECTED'
    >>> f.message
    'hang detected: Rank 1 never entered all_reduce #15. Then rank 0 on ?: RuntimeError: timeout'
    """
    failures = list(failures)
    culprits = cause.culprit_ranks if cause is not None else ()
    groups = tuple(group_failures(cause_first(failures, culprits)))
    if cause is None or cause.verdict is Verdict.STRAGGLER:
        return AttemptFailed(Reason.WORKER_CRASH, summarise(list(groups)), groups)
    then = f" Then {summarise(list(groups))}" if groups else ""
    if cause.verdict is Verdict.RANK_EXITED:
        if culprits and not set(culprits) & {f.rank for f in failures}:
            # The culprit ended "cleanly" (exit 0) and its peers failed of it: it leads.
            return AttemptFailed(Reason.WORKER_CRASH, f"{cause.summary}{then}", groups)
        return AttemptFailed(Reason.WORKER_CRASH, summarise(list(groups)) or cause.summary,
                             groups)
    return AttemptFailed(Reason.HANG_DETECTED, f"hang detected: {cause.summary}{then}", groups)
