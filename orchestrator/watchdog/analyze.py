"""Hang analysis: per-rank evidence -> DiagnosisReport. Pure, and it never raises.

How a verdict is reached:
1. Each process group's collectives are aligned across its members by collective seq
   (`align.build_view`); the majority at each seq is the reference, so a culprit rank 0 is
   named as such instead of blaming everyone else.
2. COLLECTIVE_MISMATCH when members ran different op / sizes / dtypes at the same seq
   (including ops a worker announced right before a call that aborted it).
3. RANK_EXITED when a rank's process is gone.
4. A wait-for graph: a rank blocked at seq S of a group waits for the members that never
   enqueued S; a rank blocked in send/recv waits for its peer unless the peer is blocked in the
   matching op. The culprits are the ranks waited on that are not waiting themselves (so a rank
   stuck in another group because of the culprit is not blamed). Reached through p2p edges:
   P2P_MISMATCH, else NOT_JOINED. When a group's waiting members are a strict minority and the
   others are idle, the minority issued an extra collective and is named instead.
5. COMM_WEDGED when every member of a stuck group enqueued it and none finished: suspect
   hardware comes from NCCL errors and the topology the stuck groups share.
6. Nobody in a collective: STRAGGLER when time-to-enter names a persistently late rank, else
   NON_COLLECTIVE_HANG with the common stack frame.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from orchestrator.watchdog import advice
from orchestrator.watchdog.align import PgView, build_view, resolve_members
from orchestrator.watchdog.culprits import GPU_ERROR, NIC_ERROR
from orchestrator.watchdog.detect import StragglerPolicy, find_stragglers, straggler_scores
from orchestrator.watchdog.exits import first_line, peer_lost
from orchestrator.watchdog.hardware import suspect_hardware
from orchestrator.watchdog.inputs import AnalysisInput, PendingOp, RankEvidence
from orchestrator.watchdog.report import (
    DiagnosisReport,
    Mismatch,
    PgProgress,
    RankReport,
    SuspectHardware,
    Verdict,
    group_dimension,
)
from orchestrator.watchdog.waitgraph import p2p_pending, wait_edges


@dataclass
class _Ctx:
    inp: AnalysisInput
    by_rank: dict[int, RankEvidence]
    views: list[PgView]
    p2p: list[tuple[int, PendingOp]]
    waiting: set[int]
    dead: set[int]
    coverage: float
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Finding:
    verdict: Verdict
    culprits: tuple[int, ...]
    confidence: float
    summary: str
    mismatches: tuple[Mismatch, ...] = ()
    hardware: tuple[SuspectHardware, ...] = ()
    details: dict[str, object] = field(default_factory=dict)


def analyze(inp: AnalysisInput, *, straggler_policy: StragglerPolicy | None = None
            ) -> DiagnosisReport:
    """Classify a stalled (or straggling) job. Never raises: on an internal error it returns
    UNKNOWN with the error in `details`."""
    try:
        ctx = _context(inp)
        finding = _classify(ctx, straggler_policy or StragglerPolicy())
        return DiagnosisReport(
            verdict=finding.verdict, culprit_ranks=finding.culprits,
            confidence=finding.confidence, summary=finding.summary + _user_lines(ctx, finding),
            evidence=_rank_reports(ctx), mismatches=finding.mismatches,
            suspect_hardware=finding.hardware,
            recommendations=advice.recommendations(finding.verdict, _facts(ctx, finding)),
            artifacts=_artifacts(inp),
            details={**finding.details, "trigger": inp.trigger, "world_size": inp.world_size,
                     "coverage": round(ctx.coverage, 3), "notes": ctx.notes,
                     "groups": [_view_detail(v) for v in ctx.views if v.stuck_seq is not None]})
    except Exception as ex:  # noqa: BLE001 - the watchdog must always produce a report
        return DiagnosisReport(
            verdict=Verdict.UNKNOWN, culprit_ranks=(), confidence=0.0,
            summary=f"Automated diagnosis failed ({type(ex).__name__}: {ex}); "
                    "read the per-rank artifacts.",
            recommendations=advice.recommendations(Verdict.UNKNOWN),
            artifacts=_safe_artifacts(inp),
            details={"error": f"{type(ex).__name__}: {ex}", "traceback": traceback.format_exc()})


def _facts(ctx: _Ctx, finding: _Finding) -> advice.JobFacts:
    """What this job's evidence says, for the recommendations: its devices, whether a rank
    exited (of its own error), how many nodes it spans, network errors in its logs."""
    locs = [ctx.inp.locations.get(r) for r in range(ctx.inp.world_size)]
    located = [loc for loc in locs if loc is not None]
    errors = [x for ev in ctx.by_rank.values() for x in ev.log_errors]
    gpus: bool | None = None
    if any(loc.gpu is not None for loc in located) or any(GPU_ERROR.search(x) for x in errors):
        gpus = True
    elif located and len(located) == len(locs):
        gpus = False
    nodes = {loc.node for loc in located}
    culprit_info = [ctx.by_rank[r].exit_info for r in finding.culprits
                    if r in ctx.dead and ctx.by_rank[r].exit_info]
    return advice.JobFacts(
        gpus=gpus, exited=bool(ctx.dead),
        crashed=finding.verdict is Verdict.RANK_EXITED and any(
            not peer_lost(x) and not x.startswith("exit code 0") for x in culprit_info),
        multi_node=(len(nodes) > 1) if located and len(located) == len(locs) else None,
        suspect_hardware=bool(finding.hardware),
        network_errors=any(NIC_ERROR.search(x) for x in errors))


def _pg_sort_key(pg: str) -> tuple[int, str]:
    return (int(pg), "") if pg.isdigit() else (1 << 30, pg)


def _context(inp: AnalysisInput) -> _Ctx:
    by_rank = {ev.rank: ev for ev in inp.ranks}
    members = resolve_members(inp)
    views = [build_view(inp, pg, m, by_rank)
             for pg, m in sorted(members.items(), key=lambda kv: _pg_sort_key(kv[0]))]
    dead = {r for r, ev in by_rank.items() if ev.alive is False}
    p2p = [(r, op) for r, op in p2p_pending(by_rank, members) if r not in dead]
    waiting = {r for v in views for r in v.waiters} | {r for r, _ in p2p}
    waiting |= {r for r, ev in by_rank.items() if r not in dead and any(
        not p.is_p2p and p.source == "stack" for p in ev.pending)}
    known = {r for r, ev in by_rank.items()
             if ev.trace is not None or ev.pending or ev.alive is False or ev.stack}
    coverage = len(known) / max(1, inp.world_size)
    return _Ctx(inp=inp, by_rank=by_rank, views=views, p2p=p2p, waiting=waiting, dead=dead,
                coverage=coverage)


def _classify(ctx: _Ctx, policy: StragglerPolicy) -> _Finding:
    found = _mismatch_finding(ctx)
    if found:
        return found
    if ctx.inp.trigger == "straggler" and not ctx.dead:
        found = _straggler_finding(ctx, policy)
        if found:
            return found
    if ctx.dead:
        return _lost_peers_finding(ctx) or _exited_finding(ctx)
    found = _wait_graph_finding(ctx)
    if found:
        return found
    found = _wedged_finding(ctx)
    if found:
        return found
    if not ctx.waiting:
        found = _straggler_finding(ctx, policy)
        return found or _non_collective_finding(ctx)
    return _Finding(Verdict.UNKNOWN, (), 0.2,
                    "Ranks are waiting in collectives but the evidence does not say on whom; "
                    "read the per-rank artifacts.")


def _who(ctx: _Ctx, ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    text = advice.ranks_text(rs)
    if len(rs) == 1:
        loc = ctx.inp.locations.get(rs[0])
        where = loc.describe() if loc else ""
        return f"{text} ({where})" if where else text
    return text


def _mismatch_finding(ctx: _Ctx) -> _Finding | None:
    views = [v for v in ctx.views if v.mismatches]
    if not views:
        return None
    v = min(views, key=lambda v: (v.stuck_seq is None, v.mismatches[0].seq or 0))
    m = v.mismatches[0]
    tie = m.expected.startswith("no majority")
    others = len(m.agreeing)
    ran = "; ".join(f"{val} on rank {r}" for r, val in sorted(m.actual.items())[:4])
    if tie:
        summary = (f"{advice.ranks_text(m.ranks)} disagree on collective #{m.seq} on "
                   f"{v.label()}: {ran}; no majority says which is right.")
    else:
        summary = (f"{_who(ctx, m.ranks)} called {', '.join(sorted(set(m.actual.values())))}"
                   f" at collective #{m.seq} on {v.label()} while the other {others} "
                   f"rank(s) called {m.expected} ({m.field} differ).")
    conf = (0.5 if tie else 0.9) * min(1.0, 0.5 + ctx.coverage / 2)
    return _Finding(Verdict.COLLECTIVE_MISMATCH, m.ranks, conf, summary, mismatches=(m,),
                    details={"pg": v.pg, "seq": m.seq})


def _lost_peers_finding(ctx: _Ctx) -> _Finding | None:
    """Every rank that exited did so because a peer stopped answering (its collective timed
    out, its connection closed) while ranks it waited for still run: the hang was theirs, and
    the exits came after it (a diagnosis taken after the collective timeout). The wait graph
    then names the live ranks the others waited for; None when it names no live rank."""
    if not all(peer_lost(ctx.by_rank[r].exit_info) for r in ctx.dead) or \
            len(ctx.dead) == len(ctx.by_rank):
        return None
    # Read as of before the exits: what each dead rank's trace says it was blocked in.
    before = _context(replace(ctx.inp, ranks=tuple(
        replace(ev, alive=True) if ev.rank in ctx.dead else ev for ev in ctx.inp.ranks)))
    found = _wait_graph_finding(before)
    if found is None or not found.culprits or set(found.culprits) & ctx.dead:
        return None
    dead = sorted(ctx.dead)
    why = first_line(ctx.by_rank[dead[0]].exit_info, 200)
    summary = (found.summary.rstrip(".") + f"; {advice.ranks_text(dead).lower()} "
               f"{'has' if len(dead) == 1 else 'have'} since exited"
               + (f" ({why})" if why else "") + ".")
    return replace(found, summary=summary,
                   details={**found.details, "dead_ranks": dead, "peer_lost": dead})


def _exited_finding(ctx: _Ctx) -> _Finding:
    """The culprit is the first rank that ended of its own fault (exception, signal, OOM);
    ranks whose error says a peer went away ("Connection closed by peer", a recv timeout, an
    aborted communicator) lost it, and are named once, in one clause, not blamed."""
    dead = sorted(ctx.dead)
    lost = [r for r in dead if peer_lost(ctx.by_rank[r].exit_info)]
    own = [r for r in dead if r not in lost] or dead
    times: dict[int, float] = {r: t for r in own
                               if (t := ctx.by_rank[r].exit_time_s) is not None}
    culprits = own
    if len(times) == len(own) and len(own) > 1:
        # Ranks that died within a second of the first died of the same cause, or of it.
        first = min(times.values())
        culprits = [r for r in own if times[r] - first <= 1.0]
    bystanders = [r for r in dead if r not in culprits]
    info = ctx.by_rank[culprits[0]].exit_info
    waits = [v for v in ctx.views if v.stuck_seq is not None and v.waiters]
    tail = ""
    if waits:
        v = waits[0]
        tail = (f"; {len(v.waiters)} rank(s) are waiting for it in {v.stuck_op} "
                f"#{v.stuck_seq} on {v.label()}")
    if bystanders:
        why = first_line(ctx.by_rank[bystanders[0]].exit_info, 200)
        verb = "lost" if set(bystanders) <= set(lost) else "ended after"
        tail += (f"; {advice.ranks_text(bystanders).lower()} {verb} "
                 f"{'it' if len(culprits) == 1 else 'them'}"
                 + (f" ({why})" if why and verb == "lost" else ""))
    summary = (f"{_who(ctx, culprits)} exited"
               + (f" ({first_line(info)})" if info else "") + tail + ".")
    return _Finding(Verdict.RANK_EXITED, tuple(culprits), 0.9, summary,
                    details={"dead_ranks": dead, "peer_lost": lost})


def _wait_graph_finding(ctx: _Ctx) -> _Finding | None:
    targets, extra, lines = wait_edges(views=ctx.views, p2p=ctx.p2p, waiting=ctx.waiting,
                                       by_rank=ctx.by_rank, dead=ctx.dead)
    sinks = sorted(r for r in targets if r not in ctx.waiting)
    if not sinks and not extra and not targets:
        return None
    if not sinks and extra:
        return _Finding(Verdict.NOT_JOINED, tuple(sorted(extra)), 0.6 * ctx.coverage,
                        f"{_who(ctx, extra)} {lines[0].split(' ', 2)[2]}, an extra collective; "
                        "the others are idle.", details={"wait_for": lines})
    if not sinks:
        cyc = sorted(targets)
        return _Finding(Verdict.NOT_JOINED, tuple(cyc), 0.5 * ctx.coverage,
                        f"{advice.ranks_text(cyc)} wait on each other in different process "
                        "groups: the collective order differs between ranks.",
                        details={"wait_for": lines})
    p2p = any("p2p" in targets[r] for r in sinks)
    no_info = [r for r in sinks if all(r not in v.not_joined for v in ctx.views)
               and not any(p.peer == r for _, p in ctx.p2p)]
    # As many waiting as missing (1 vs 1 in a 2-rank group): "never entered" and "the other
    # made an extra call" read the same from the traces, so say so in the confidence.
    tie = not p2p and all(len(v.waiters) <= len(v.not_joined) for v in ctx.views
                          if v.stuck_seq is not None and set(sinks) & set(v.not_joined))
    conf = (0.85 if p2p else 0.9) * (0.6 if no_info == sinks else 1.0) * ctx.coverage ** 0.5
    conf *= 0.8 if tie and no_info != sinks else 1.0
    return _Finding(Verdict.P2P_MISMATCH if p2p else Verdict.NOT_JOINED, tuple(sinks),
                    conf, _sink_summary(ctx, sinks, p2p), details={"wait_for": lines})


def _sink_summary(ctx: _Ctx, sinks: list[int], p2p: bool) -> str:
    if p2p:
        waiters = sorted({r for r, p in ctx.p2p if p.peer in sinks})
        ops = sorted({p.op for r, p in ctx.p2p if p.peer in sinks})
        return (f"{_who(ctx, sinks)} never posted the matching send/recv: "
                f"{advice.ranks_text(waiters).lower()} {'is' if len(waiters) == 1 else 'are'} "
                f"blocked in {'/'.join(ops)} with it.")
    v = next((v for v in ctx.views if set(sinks) & set(v.not_joined + v.unknown) and v.waiters),
             None)
    if v is None:  # stacks only, no Flight Recorder
        inside = sorted(r for r, ev in ctx.by_rank.items() if r in ctx.waiting)
        ops = sorted({p.op for r in inside for p in ctx.by_rank[r].pending if not p.is_p2p})
        return (f"{_who(ctx, sinks)} is not inside any collective while "
                f"{advice.ranks_text(inside).lower()} {'is' if len(inside) == 1 else 'are'} "
                f"blocked in {'/'.join(ops) or 'a collective'} (from stacks; no Flight Recorder)"
                ".")
    n = len(v.waiters)
    missing_info = [r for r in sinks if r in v.unknown]
    extra = f" (no evidence from {advice.ranks_text(missing_info).lower()})" if missing_info \
        else ""
    return (f"{_who(ctx, sinks)} never entered {v.stuck_op or 'collective'} #{v.stuck_seq} on "
            f"{v.label()}; "
            f"the other {n} rank{'s are' if n != 1 else ' is'} waiting in it{extra}.")


def _wedged_finding(ctx: _Ctx) -> _Finding | None:
    stuck = [v for v in ctx.views if v.stuck_seq is not None and v.waiters
             and not v.not_joined and not v.unknown and not v.exited]
    pairs = sorted({tuple(sorted((r, p.peer))) for r, p in ctx.p2p if p.peer is not None})
    if not stuck and not pairs:
        return None
    stuck_groups = [v.members for v in stuck] + [tuple(p) for p in pairs]
    healthy = [v.members for v in ctx.views if v.stuck_seq is None and len(v.members) > 1]
    errors = sorted(r for r, ev in ctx.by_rank.items() if ev.log_errors)
    hw = suspect_hardware(stuck_groups=stuck_groups, healthy_groups=healthy,
                          error_ranks=errors, locations=ctx.inp.locations)
    stuck_ranks = sorted({r for g in stuck_groups for r in g})
    culprits = errors or (sorted(set(hw[0].ranks) & set(stuck_ranks)) if hw else stuck_ranks)
    where = f" Suspect {hw[0].level} {hw[0].name} ({hw[0].reason})." if hw else ""
    what = (f"{stuck[0].stuck_op} #{stuck[0].stuck_seq} on {stuck[0].label()}" if stuck
            else "matching send/recv")
    summary = (f"All members of {len(stuck_groups)} group(s) entered {what} and none "
               f"completed it: communication is wedged, not the program.{where}")
    conf = (0.8 if errors else 0.6 if hw else 0.45) * ctx.coverage
    return _Finding(Verdict.COMM_WEDGED, tuple(culprits), conf, summary, hardware=hw,
                    details={"stuck_ranks": stuck_ranks})


def _enter_times(ctx: _Ctx) -> dict[int, dict[tuple[str, int], float]]:
    out: dict[int, dict[tuple[str, int], float]] = {}
    for r, ev in ctx.by_rank.items():
        times = dict(ev.enter_times)
        if not times and ev.trace is not None:
            for e in ev.trace.entries:
                if not e.is_p2p and e.collective_seq is not None and e.time_created_ns:
                    times[(e.pg, e.collective_seq)] = e.time_created_ns / 1e9
        if times:
            out[r] = times
    return out


def _straggler_finding(ctx: _Ctx, policy: StragglerPolicy) -> _Finding | None:
    scores = straggler_scores(_enter_times(ctx), min_spread_s=policy.min_spread_s)
    slow = find_stragglers(scores, policy)
    if not slow:
        return None
    by = {s.rank: s for s in scores}
    lat = max(by[r].median_lateness_s for r in slow)
    frac = min(by[r].late_fraction for r in slow)
    summary = (f"{_who(ctx, slow)} is a straggler, not a hang: it enters collectives "
               f"{lat * 1000:.0f} ms after the others (last in {frac:.0%} of "
               f"{by[slow[0]].samples} collectives).")
    return _Finding(Verdict.STRAGGLER, slow, 0.5 + 0.4 * frac, summary,
                    details={"straggler_scores": [s.__dict__ for s in scores if s.rank in slow]})


def _non_collective_finding(ctx: _Ctx) -> _Finding:
    alive = sorted(r for r, ev in ctx.by_rank.items() if ev.alive is not False)
    tops = Counter(_top(ev) for r, ev in ctx.by_rank.items() if r in alive and _top(ev))
    if not alive or (not tops and ctx.coverage < 0.5):
        return _Finding(Verdict.UNKNOWN, (), 0.1,
                        "No usable evidence: no rank answered with a trace or a stack.")
    top, n = tops.most_common(1)[0] if tops else ("an unknown frame", 0)
    summary = (f"No rank is inside a collective: all {len(alive)} ranks are blocked outside "
               f"torch.distributed, {n} of them at {top}.")
    return _Finding(Verdict.NON_COLLECTIVE_HANG, tuple(alive), 0.7 * ctx.coverage, summary,
                    details={"top_frames": dict(tops.most_common(5))})


def _user_lines(ctx: _Ctx, finding: _Finding) -> str:
    """Where in the user's own code the culprits are (user-code jobs; up to three ranks):
    ' Rank 3 is at train.py:212 in save_checkpoint(): time.sleep(600).'."""
    if finding.verdict is Verdict.NON_COLLECTIVE_HANG:
        return ""  # its summary already names the common frame
    parts = []
    for r in finding.culprits[:3]:
        ev = ctx.by_rank.get(r)
        if ev is not None and ev.user_frame:
            parts.append(f"{advice.ranks_text([r])} is at {ev.user_frame}")
    return (" " + "; ".join(parts) + ".") if parts else ""


def _top(ev: RankEvidence) -> str | None:
    if ev.top_of_stack:
        return ev.top_of_stack
    if ev.stack:
        lines = [ln.strip() for ln in ev.stack.strip().splitlines() if ln.strip()]
        files = [ln for ln in lines if ln.startswith("File ")]
        return files[-1] if files else (lines[-1] if lines else None)
    return None


def _rank_reports(ctx: _Ctx) -> tuple[RankReport, ...]:
    not_joined = {r for v in ctx.views for r in v.not_joined}
    out = []
    for r in range(ctx.inp.world_size):
        ev = ctx.by_rank.get(r)
        if ev is None:
            out.append(RankReport(rank=r, state="unknown", location=ctx.inp.locations.get(r)))
            continue
        state = ("exited" if r in ctx.dead else "waiting" if r in ctx.waiting
                 else "not_joined" if r in not_joined
                 else "unknown" if ev.trace is None and not ev.stack else "idle")
        pgs = tuple(PgProgress(pg=v.pg, name=group_dimension(v.name, v.pg),
                               last_enqueued=v.enqueued.get(r),
                               last_completed=v.completed.get(r),
                               pending_op=f"{v.stuck_op} #{v.stuck_seq}"
                               if r in v.waiters else None,
                               missing_op=f"{v.stuck_op or 'collective'} #{v.stuck_seq}"
                               if r in v.not_joined else None)
                    for v in ctx.views if r in v.members)
        out.append(RankReport(rank=r, state=state, step=ev.step, pgs=pgs, top_of_stack=_top(ev),
                              nccl_errors=ev.log_errors[:5], exit_info=ev.exit_info,
                              location=ctx.inp.locations.get(r), has_trace=ev.trace is not None))
    return tuple(out)


def _view_detail(v: PgView) -> dict[str, object]:
    return {"pg": v.pg, "name": v.name, "stuck_seq": v.stuck_seq, "op": v.stuck_op,
            "waiting": list(v.waiters), "not_joined": list(v.not_joined),
            "exited": list(v.exited), "no_evidence": list(v.unknown)}


def _artifacts(inp: AnalysisInput) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*inp.artifacts, *(a for ev in inp.ranks for a in ev.artifacts)]))


def _safe_artifacts(inp: AnalysisInput) -> tuple[str, ...]:
    try:
        return _artifacts(inp)
    except Exception:  # noqa: BLE001
        return ()
