"""Align one process group's collectives across its member ranks by collective seq.

Pure module. The reference at each seq is the MAJORITY of the ranks that have an entry there,
never the first rank: PyTorch's own analyzer takes rank 0 as the truth and blames everyone else
when rank 0 is the one that diverged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.watchdog.inputs import DEFAULT_PG, AnalysisInput, RankEvidence
from orchestrator.watchdog.report import Mismatch

MISMATCH_WINDOW = 32  # seqs before the stuck one that are compared; older ones are history

_DTYPE_ALIASES = {
    "float32": "float", "float": "float", "float64": "double", "double": "double",
    "float16": "half", "half": "half", "bfloat16": "bfloat16", "int64": "long", "long": "long",
    "int32": "int", "int": "int", "uint8": "byte", "byte": "byte", "int8": "char",
    "char": "char", "bool": "bool",
}


def norm_dtype(d: str) -> str:
    d = d.lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(d, d)


@dataclass(frozen=True)
class Fingerprint:
    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    def text(self) -> str:
        if not self.sizes and not self.dtypes:
            return self.op  # from logs that name only the op type
        sizes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in self.sizes)
        return f"{self.op}([{sizes}], {','.join(self.dtypes) or '?'})"


@dataclass(frozen=True)
class PgView:
    pg: str
    name: str
    members: tuple[int, ...]
    enqueued: Mapping[int, int | None]  # None: no information for that rank
    completed: Mapping[int, int | None]
    stuck_seq: int | None  # oldest collective some member enqueued and nobody finished
    stuck_op: str | None
    waiters: tuple[int, ...]  # alive members blocked at stuck_seq
    not_joined: tuple[int, ...]  # alive members with a trace that never enqueued stuck_seq
    exited: tuple[int, ...]  # dead members
    unknown: tuple[int, ...]  # alive-or-unknown members without any trace
    mismatches: tuple[Mismatch, ...]

    def label(self) -> str:
        return f"pg {self.pg}" + (f" ({self.name})" if self.name and self.name != self.pg else "")


def resolve_members(inp: AnalysisInput) -> dict[str, tuple[int, ...]]:
    """Group membership: given > dump pg_config > ranks whose dumps mention the group."""
    members: dict[str, tuple[int, ...]] = dict(inp.pg_members)
    members.setdefault(DEFAULT_PG, tuple(range(inp.world_size)))
    seen: dict[str, set[int]] = {}
    for ev in inp.ranks:
        if ev.trace is None:
            continue
        for pg, cfg in ev.trace.pg_config.items():
            if pg not in members and cfg.ranks:
                members[pg] = cfg.ranks
        for pg in ev.trace.pgs():
            seen.setdefault(pg, set()).add(ev.rank)
        for p in ev.pending:
            seen.setdefault(p.pg, set()).add(ev.rank)
    for ev in inp.ranks:
        for p in ev.pending:
            seen.setdefault(p.pg, set()).add(ev.rank)
    for pg, ranks in seen.items():
        members.setdefault(pg, tuple(sorted(ranks)))
    return members


def _fingerprints(ev: RankEvidence, pg: str) -> dict[int, Fingerprint]:
    out: dict[int, Fingerprint] = {}
    if ev.trace is not None:
        for seq, e in ev.trace.collectives(pg).items():
            dtypes = tuple(norm_dtype(d) for d in e.input_dtypes)
            out[seq] = Fingerprint(e.op, e.input_sizes, dtypes)
    for p in ev.pending:
        # op "?" is progress without an op (from logs): it cannot disagree with anything.
        if p.pg == pg and not p.is_p2p and p.seq is not None and p.seq not in out \
                and p.op != "?":
            out[p.seq] = Fingerprint(p.op, p.sizes, tuple(norm_dtype(d) for d in p.dtypes))
    return out


def _progress(ev: RankEvidence | None, pg: str) -> tuple[int | None, int | None, int | None]:
    """(last enqueued, last completed, oldest pending) for one rank; Nones without info."""
    if ev is None:
        return None, None, None
    announced = [p.seq for p in ev.pending if p.pg == pg and not p.is_p2p and p.seq is not None]
    if ev.trace is None and not announced:
        return None, None, None
    enq = ev.trace.last_enqueued(pg) if ev.trace else None
    done = ev.trace.last_completed(pg) if ev.trace else None
    enq = max([s for s in [enq, *announced] if s is not None], default=0)
    floor = done or 0
    pending = [s for s, e in (ev.trace.collectives(pg).items() if ev.trace else ())
               if not e.completed and s > floor]
    pending += [s for s in announced if s > floor]
    if not pending and enq > floor and ev.trace and not ev.trace.collectives(pg):
        pending.append(floor + 1)  # entries evicted from the ring; pg_status still says so
    return enq, done, (min(pending) if pending else None)


def build_view(inp: AnalysisInput, pg: str, members: tuple[int, ...],
               by_rank: Mapping[int, RankEvidence]) -> PgView:
    prog = {r: _progress(by_rank.get(r), pg) for r in members}
    dead = tuple(r for r in members if r in by_rank and by_rank[r].alive is False)
    pend = [p[2] for r, p in prog.items() if p[2] is not None]
    stuck = min(pend) if pend else None
    waiters: list[int] = []
    not_joined: list[int] = []
    unknown: list[int] = []
    for r in members:
        enq, _, first = prog[r]
        if r in dead:
            continue
        if enq is None:
            unknown.append(r)
        elif stuck is not None and enq < stuck:
            not_joined.append(r)
        elif stuck is not None and first is not None:
            waiters.append(r)
    fps = {r: _fingerprints(by_rank[r], pg) for r in members if r in by_rank}
    mismatches = _mismatches(pg, fps, stuck)
    stuck_op = None
    if stuck is not None:
        at = Counter(fp[stuck].op for fp in fps.values() if stuck in fp)
        stuck_op = at.most_common(1)[0][0] if at else None
    name = inp.pg_names.get(pg, "")
    if not name:
        for ev in by_rank.values():
            if ev.trace:
                desc = next((e.pg_desc for e in ev.trace.entries if e.pg == pg), "")
                cfg = ev.trace.pg_config.get(pg)
                name = desc or (cfg.desc if cfg else "")
                if name:
                    break
    return PgView(pg=pg, name=name if name not in ("undefined",) else "", members=members,
                  enqueued={r: p[0] for r, p in prog.items()},
                  completed={r: p[1] for r, p in prog.items()}, stuck_seq=stuck,
                  stuck_op=stuck_op, waiters=tuple(waiters), not_joined=tuple(not_joined),
                  exited=dead, unknown=tuple(unknown), mismatches=mismatches)


def _mismatches(pg: str, fps: Mapping[int, Mapping[int, Fingerprint]],
                stuck: int | None) -> tuple[Mismatch, ...]:
    """Earliest seq (within the window) where member fingerprints disagree."""
    seqs = sorted({s for fp in fps.values() for s in fp})
    if stuck is not None:
        seqs = [s for s in seqs if stuck - MISMATCH_WINDOW <= s <= stuck]
    for seq in seqs:
        at = {r: fp[seq] for r, fp in fps.items() if seq in fp}
        if len(at) < 2 or len(set(at.values())) == 1:
            continue
        m = _one_mismatch(pg, seq, at)
        if m is not None:
            return (m,)
    return ()


def _one_mismatch(pg: str, seq: int, at: Mapping[int, Fingerprint]) -> Mismatch | None:
    # Op-only fingerprints (from logs or heartbeats) are compared on the op alone.
    full = {r: fp for r, fp in at.items() if fp.sizes or fp.dtypes}
    counts = Counter((full or at).values())
    (ref, n), *rest = counts.most_common()
    tie = bool(rest) and rest[0][1] == n
    deviants = {r: fp for r, fp in at.items()
                if (r in full or not full) and (tie or fp != ref)
                or r not in full and full and fp.op != ref.op}
    if not deviants:
        return None
    if any(fp.op != ref.op for fp in deviants.values()):
        field = "op"
    elif any(fp.sizes != ref.sizes for fp in deviants.values()):
        field = "sizes"
    else:
        field = "dtypes"
    expected = "no majority (tie)" if tie else ref.text()
    return Mismatch(pg=pg, seq=seq, field=field, expected=expected,
                    actual={r: fp.text() for r, fp in deviants.items()},
                    agreeing=tuple(r for r in at if r not in deviants))
