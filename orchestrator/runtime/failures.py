"""Grouping of per-rank failures, so 64 ranks do not print 64 traces. Pure module.

Two errors are the same when their type and message match after numbers, hex ids and
addresses are normalised. The normalised `signature` is only the grouping key: what a reader
sees (`message`, `example`, the attempt's summary) is the first rank's own text, with only
secrets (the job's `entrypoint.env` values, API tokens) masked:

>>> groups = group_failures([
...     RankFailure(rank=3, node="n1", error_type="OSError", message="[Errno 28] shard-7.bin"),
...     RankFailure(rank=5, node="n2", error_type="OSError", message="[Errno 28] shard-9.bin"),
... ])
>>> [(g.signature, g.message, g.ranks) for g in groups]
[('OSError: [Errno <N>] shard-<N>.bin', 'OSError: [Errno 28] shard-7.bin', (3, 5))]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator.lifecycle import RankState, Reason
from orchestrator.text.ranges import format_ranges
from orchestrator.watchdog.culprits import DEVICE_ERROR
from orchestrator.watchdog.exits import first_line, peer_lost
from orchestrator.watchdog.report import DiagnosisReport, Verdict

_PATTERNS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<HEX>"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<ID>"),
    (re.compile(r"\[?\b\d{1,3}(\.\d{1,3}){3}\b\]?(:\d+)?"), "<ADDR>"),
    (re.compile(r"\d+(\.\d+)?"), "<N>"),
)


# API tokens and session secrets as meshyard issues them (orchestrator/store/users.py,
# sessions.py), and bearer credentials in general.
_TOKENS = re.compile(r"\b(?:msy|mss)_[A-Za-z0-9_-]{16,}|(?i:bearer)\s+[A-Za-z0-9._~+/-]{16,}=*")
SECRET_MASK = "***"


def mask_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret value (at least 4 characters: shorter ones would mask ordinary
    words and digits) and every token-shaped string replaced by ***. Nothing else changes.

    >>> mask_secrets("auth failed for key s3cr3t-v4lue (errno 13)", ["s3cr3t-v4lue", "1"])
    'auth failed for key *** (errno 13)'
    """
    for value in sorted({v for v in secrets if v and len(v) >= 4}, key=len, reverse=True):
        text = text.replace(value, SECRET_MASK)
    return _TOKENS.sub(SECRET_MASK, text)


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

    @property
    def peer_lost(self) -> bool:
        """Its error says a peer went away (gloo's "Connection closed by peer", a recv
        timeout, an aborted communicator): fallout of another rank's end, not a cause."""
        return not self.died and peer_lost(self.message)


@dataclass(frozen=True)
class FailureGroup:
    signature: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    example: str  # one full message, for the reader
    traceback: str  # one traceback tail (the first rank's)
    exit_codes: tuple[tuple[int, int], ...] = ()  # (rank, exit status) of user-code ranks
    error_type: str = ""
    peer_lost: bool = False  # every member failed because a peer went away

    @property
    def message(self) -> str:
        """What a reader sees: the error type and the first line of one real message."""
        text = first_line(self.example)
        if not self.error_type:
            return text or self.signature
        return f"{self.error_type}: {text}" if text else self.error_type

    def to_dict(self) -> dict[str, Any]:
        out = {"signature": self.signature, "message": self.message, "ranks": list(self.ranks),
               "nodes": list(self.nodes), "count": len(self.ranks), "example": self.example,
               "traceback": self.traceback}
        if self.exit_codes:
            out["exit_codes"] = {str(r): c for r, c in self.exit_codes}
        if self.peer_lost:
            out["peer_lost"] = True
        return out

    def exit_text(self) -> str:
        """' (exit code 3)', ' (exit codes 1, 3)', or '' for ranks without one."""
        codes = sorted({c for _, c in self.exit_codes})
        if not codes:
            return ""
        return f" (exit code{'s' if len(codes) > 1 else ''} {', '.join(map(str, codes))})"


def group_failures(failures: Iterable[RankFailure], *, secrets: Iterable[str] = ()
                   ) -> list[FailureGroup]:
    """Groups rank failures, in the order given (earliest first: the group holding the
    earliest failure comes first; it is usually the cause, the others are fallout).
    `secrets`: values masked in every message and traceback kept."""
    secrets = tuple(secrets)
    order: list[str] = []
    members: dict[str, list[RankFailure]] = {}
    for f in failures:
        sig = f"{f.error_type or 'Error'}: {normalise(mask_secrets(f.message, secrets))}"
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
                                example=mask_secrets(fs[0].message, secrets)[:2000],
                                traceback=mask_secrets(fs[0].traceback[-4000:], secrets),
                                exit_codes=codes, error_type=fs[0].error_type or "Error",
                                peer_lost=all(f.peer_lost for f in fs)))
    return out


class Blame(StrEnum):
    """What a failure points at. Only NODE evidence makes a node avoided by the job's next
    attempt; a USER failure is restarted only when `fault_tolerance.retry_on` matches it."""

    USER = "user"  # the job's own code raised, or its process exited non-zero
    NODE = "node"  # the worker process died (its node or raylet), or a device / NIC error
    INFRA = "infra"  # neither: a signal, a lost peer, a collective timeout; restarted by count


# torch.distributed's own errors (timeouts, a store or network failure) are not the user's bug
_DIST_ERRORS = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError",
                          "DistError", "Signal"})


def blame(f: RankFailure, *, user_code: bool) -> Blame:
    """What one rank's failure points at.

    >>> blame(RankFailure(rank=1, error_type="AttributeError", message="x", exit_code=1),
    ...       user_code=True)
    <Blame.USER: 'user'>
    >>> blame(RankFailure(rank=1, error_type="WorkerDied", message="node n1 lost"),
    ...       user_code=True)
    <Blame.NODE: 'node'>
    """
    if f.died or DEVICE_ERROR.search(f"{f.message}\n{f.traceback[-2000:]}"):
        return Blame.NODE
    if not user_code or f.peer_lost or f.error_type.rsplit(".", 1)[-1] in _DIST_ERRORS:
        return Blame.INFRA
    if f.exit_code is None or f.exit_code < 0:
        return Blame.INFRA  # no rank process ended of its own (the worker failed to run it)
    return Blame.USER


def first_cause(failures: Iterable[RankFailure]) -> RankFailure | None:
    """The failure that explains the others: the first (in `cause_first` order) that is not
    a lost peer, else the first."""
    fs = list(failures)
    return next((f for f in fs if not f.peer_lost), fs[0] if fs else None)


def rank_end_states(failures: Iterable[RankFailure], ranks: Iterable[int]
                    ) -> dict[int, RankState]:
    """Each rank's state once a failure ended the attempt: FAILED for the ranks that failed
    of their own (or every failed rank when all of them only lost a peer), PEER_LOST for the
    ranks whose error says a peer went away, STOPPED for the ranks meshyard stopped."""
    fs = list(failures)
    any_own = any(not f.peer_lost for f in fs)
    out = {r: RankState.STOPPED for r in ranks}
    for f in fs:
        out[f.rank] = RankState.PEER_LOST if any_own and f.peer_lost else RankState.FAILED
    return out


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_NOT_USER = ("site-packages", "dist-packages", "/meshyard/", "<frozen", "/lib/python")


def raised_at(traceback: str) -> str | None:
    r"""`file:line in function` of the innermost frame of the user's own code in a Python
    traceback (frames of installed packages, the standard library and meshyard's runner
    skipped; the innermost frame when all are).

    >>> raised_at('Traceback (most recent call last):\n  File "/code/train.py", line 9, in main'
    ...           '\n  File "/usr/lib/python3.11/json/__init__.py", line 3, in loads\n')
    'train.py:9 in main'
    """
    frames = _FRAME.findall(traceback)
    if not frames:
        return None
    own = [f for f in frames if not any(s in f[0] for s in _NOT_USER)] or frames
    path, line, fn = own[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line} in {fn}"


# Diagnoses after which the failing rank's own error still tells who is to blame (a rank
# exited); after a hang verdict the cause is the hang, never the user's exception.
EXIT_VERDICTS = frozenset({Verdict.RANK_EXITED})


def user_error_message(f: RankFailure, summary: str, *, secrets: Iterable[str] = ()) -> str:
    """A failure of the job's own code, leading with the exception and where it was raised:
    'AttributeError at train.py:12 in main: ... (rank 1 on n1); then ...'. `summary` is the
    attempt's grouped summary, kept after it when more ranks failed."""
    where = raised_at(f.traceback)
    text = first_line(mask_secrets(f.message, secrets)) if f.message else ""
    head = f"{f.error_type}{f' at {where}' if where else ''}"
    head = f"{head}: {text}" if text else head
    if f.exit_code is not None and f.exit_code > 0 and f.error_type == "ExitCode":
        head = f"the rank process exited with code {f.exit_code}" + \
            (f" ({text})" if text and text != "the rank process exited" else "")
    rest = summary.split("; then ", 1)
    tail = f"; then {rest[1]}" if len(rest) == 2 else ""
    return f"{head} (rank {f.rank} on {f.node or '?'}){tail}"


def _who(ranks: tuple[int, ...]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else \
        f"{len(ranks)} ranks ({format_ranges(ranks)})"


def _where(nodes: tuple[str, ...]) -> str:
    return nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes"


def summarise(groups: list[FailureGroup]) -> str:
    """One clause per group of ranks that failed of their own error ('rank 1 on n2:
    ValueError: bad shard-7.bin', '62 ranks (0-61) on 8 nodes: ...'), then one clause for all
    the ranks that lost a peer, when another rank's failure explains them:
    '...; then 2 ranks (0,2) on n2 lost a peer (RuntimeError: ... Connection closed by peer)'."""
    own = [g for g in groups if not g.peer_lost]
    lost = [g for g in groups if g.peer_lost]
    if not own:
        own, lost = lost, []
    lines = [f"{_who(g.ranks)} on {_where(g.nodes)}: {g.message}{g.exit_text()}" for g in own]
    if lost:
        ranks = tuple(sorted({r for g in lost for r in g.ranks}))
        nodes = tuple(sorted({n for g in lost for n in g.nodes}))
        lines.append(f"then {_who(ranks)} on {_where(nodes)} lost a peer "
                     f"({first_line(lost[0].message, 200)})")
    return "; ".join(lines)


def cause_first(failures: Iterable[RankFailure], culprits: Iterable[int] = ()
                ) -> list[RankFailure]:
    """The diagnosis' culprits first, then ranks whose process died, then ranks that failed of
    their own error before those that lost a peer, then by time: a peer's "Connection reset by
    peer" often reaches the controller before the death it reports."""
    named = set(culprits)
    return sorted(failures, key=lambda f: (f.rank not in named, not f.died, f.peer_lost,
                                           f.time, f.rank))


@dataclass(frozen=True)
class AttemptFailed:
    """How a failed attempt is reported: reason, message (the cause first), grouped errors."""

    reason: Reason
    message: str
    groups: tuple[FailureGroup, ...]


def attempt_failed(failures: Iterable[RankFailure],
                   cause: DiagnosisReport | None = None, *,
                   secrets: Iterable[str] = ()) -> AttemptFailed:
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
    secrets = tuple(secrets)
    culprits = cause.culprit_ranks if cause is not None else ()
    groups = tuple(group_failures(cause_first(failures, culprits), secrets=secrets))
    if cause is None or cause.verdict is Verdict.STRAGGLER:
        return AttemptFailed(Reason.WORKER_CRASH, summarise(list(groups)), groups)
    summary = mask_secrets(cause.summary, secrets)
    then = f" Then {summarise(list(groups))}" if groups else ""
    if cause.verdict is Verdict.RANK_EXITED:
        if culprits and not set(culprits) & {f.rank for f in failures}:
            # The culprit ended "cleanly" (exit 0) and its peers failed of it: it leads.
            return AttemptFailed(Reason.WORKER_CRASH, f"{summary}{then}", groups)
        return AttemptFailed(Reason.WORKER_CRASH, summarise(list(groups)) or summary, groups)
    return AttemptFailed(Reason.HANG_DETECTED, f"hang detected: {summary}{then}", groups)
