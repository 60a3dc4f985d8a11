"""The wait-for graph: who is blocked waiting on whom. Pure module.

Edges: a rank blocked at seq S of a group waits for every member that never enqueued S; a
rank blocked in send/recv waits for its peer unless the peer is blocked in the matching op;
without any Flight Recorder data, a rank whose stack shows it inside a collective waits for
the group members that are not inside one. The analyzer names as culprits the ranks that are
waited on and not waiting themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.watchdog import advice
from orchestrator.watchdog.align import PgView
from orchestrator.watchdog.inputs import PendingOp, RankEvidence

_SENDS = {"send", "isend"}
_RECVS = {"recv", "irecv"}


def p2p_pending(by_rank: Mapping[int, RankEvidence],
                members: Mapping[str, tuple[int, ...]]) -> list[tuple[int, PendingOp]]:
    """Blocked send/recv per rank, peers as GLOBAL ranks (FR records group ranks)."""
    out: list[tuple[int, PendingOp]] = []
    for r, ev in by_rank.items():
        seen = set()
        for p in ev.pending:
            if p.is_p2p and (p.op, p.peer) not in seen:
                seen.add((p.op, p.peer))
                out.append((r, p))
        if ev.trace is None:
            continue
        for e in ev.trace.entries:
            if not e.is_p2p or e.completed:
                continue
            group = members.get(e.pg, ())
            peer = group[e.peer] if e.peer is not None and e.peer < len(group) else e.peer
            if (e.op, peer) not in seen:
                seen.add((e.op, peer))
                out.append((r, PendingOp(op=e.op, pg=e.pg, seq=e.p2p_seq, is_p2p=True,
                                         peer=peer, sizes=e.input_sizes, source="fr")))
    return out


def _matching(op: str) -> set[str]:
    return _RECVS if op in _SENDS else _SENDS if op in _RECVS else set()


def wait_edges(*, views: Sequence[PgView], p2p: Sequence[tuple[int, PendingOp]],
               waiting: set[int], by_rank: Mapping[int, RankEvidence], dead: set[int]
               ) -> tuple[dict[int, set[str]], set[int], list[str]]:
    """Targets -> edge kinds ("coll" / "p2p"), extra-collective callers, readable lines."""
    targets: dict[int, set[str]] = {}
    extra: set[int] = set()
    lines: list[str] = []
    for v in views:
        if v.stuck_seq is None or not v.waiters:
            continue
        missing = list(v.not_joined) + list(v.unknown)
        if not missing:
            continue
        idle = [r for r in v.not_joined if r not in waiting]
        if len(v.waiters) < len(missing) and idle == missing:
            # A minority waits while the majority idles: the minority made an extra call.
            extra.update(v.waiters)
            lines.append(f"{advice.ranks_text(v.waiters)} entered {v.stuck_op} #{v.stuck_seq}"
                         f" on {v.label()} that the other {len(missing)} never entered")
            continue
        for r in missing:
            targets.setdefault(r, set()).add("coll")
        lines.append(f"{advice.ranks_text(missing)} never entered {v.stuck_op} "
                     f"#{v.stuck_seq} on {v.label()}; {len(v.waiters)} waiting")
    _stack_only_edges(views, waiting, by_rank, dead, targets, lines)
    pend = {(r, p.op, p.peer) for r, p in p2p}
    for r, p in p2p:
        if p.peer is None or any((p.peer, m, r) in pend for m in _matching(p.op)):
            continue
        targets.setdefault(p.peer, set()).add("p2p")
        lines.append(f"rank {r} is blocked in {p.op} with rank {p.peer}, which has no "
                     f"matching {'/'.join(sorted(_matching(p.op))) or 'op'}")
    return targets, extra, lines


def _stack_only_edges(views: Sequence[PgView], waiting: set[int],
                      by_rank: Mapping[int, RankEvidence], dead: set[int],
                      targets: dict[int, set[str]], lines: list[str]) -> None:
    """No Flight Recorder for a group (disabled, dumps failed): fall back to the stacks."""
    by_pg = {v.pg: v for v in views}
    for r, ev in by_rank.items():
        for p in ev.pending:
            v = by_pg.get(p.pg)
            if p.is_p2p or p.source != "stack" or r in dead or v is None or \
                    v.stuck_seq is not None:
                continue
            idle = [q for q in v.members if q not in waiting and q not in dead
                    and q in by_rank and by_rank[q].stack]
            for q in idle:
                targets.setdefault(q, set()).add("coll")
            if idle:
                lines.append(f"rank {r} is inside {p.op} on {v.label()} (stack); "
                             f"{advice.ranks_text(idle).lower()} not in any collective")
