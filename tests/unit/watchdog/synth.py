"""Synthetic Flight Recorder dumps from a tiny blocking-collective simulator.

Every rank runs the same program (a list of ops on process groups); a rank can be told to stop
before op k (a hang), to run something else at op k (a mismatch / desync), or to be slow
(straggler). The simulator advances ranks through blocking collectives — an op completes only
when every member enqueued it — and emits per-rank dumps shaped like torch 2.13's
`_dump_fr_trace()` (gloo: state stays "scheduled", `retired` flips on completion).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.watchdog.flight_recorder import parse_dump
from orchestrator.watchdog.inputs import AnalysisInput, RankEvidence


@dataclass(frozen=True)
class Op:
    pg: str
    op: str = "all_reduce"
    sizes: tuple[tuple[int, ...], ...] = ((4, 4),)
    dtype: str = "Float"


@dataclass
class Job:
    world: int
    groups: dict[str, tuple[int, ...]]
    program: list[Op]
    stop_before: dict[int, int] = field(default_factory=dict)  # rank -> program index
    replace: dict[tuple[int, int], Op] = field(default_factory=dict)  # (rank, index) -> op
    skip: dict[int, int] = field(default_factory=dict)  # rank -> program index it skips
    delay_s: dict[int, float] = field(default_factory=dict)  # rank -> extra time per op
    backend: str = "gloo"

    def rank_ops(self, r: int) -> list[tuple[int, Op]]:
        out = []
        for i, op in enumerate(self.program):
            if r not in self.groups[op.pg] or self.skip.get(r) == i:
                continue
            if i >= self.stop_before.get(r, 1 << 30):
                break
            out.append((i, self.replace.get((r, i), op)))
        return out


def simulate(job: Job) -> dict[int, dict[str, Any]]:
    """Run to the fixed point; return raw dumps per rank."""
    ops = {r: job.rank_ops(r) for r in range(job.world)}
    pos = dict.fromkeys(ops, 0)
    seq_of: dict[int, list[int]] = {}
    for r, lst in ops.items():  # per-rank per-pg seq numbers, as each rank counts them
        counts: dict[str, int] = {}
        seq_of[r] = []
        for _, op in lst:
            counts[op.pg] = counts.get(op.pg, 0) + 1
            seq_of[r].append(counts[op.pg])
    enq: dict[int, list[float]] = {r: [] for r in ops}
    clock = dict.fromkeys(ops, 0.0)
    done: set[tuple[int, int]] = set()
    changed = True
    while changed:
        changed = False
        for r in ops:
            k = pos[r]
            if k >= len(ops[r]):
                continue
            if len(enq[r]) == k:
                clock[r] += 1.0 + job.delay_s.get(r, 0.0)
                enq[r].append(clock[r])
                changed = True
            pg = ops[r][k][1].pg
            seq = seq_of[r][k]
            peers = [(q, _index(seq_of[q], ops[q], pg, seq)) for q in job.groups[pg]]
            if all(i is not None and len(enq[q]) > i for q, i in peers):
                t = max(enq[q][i] for q, i in peers if i is not None)
                for q, i in peers:
                    done.add((q, i))
                    clock[q] = max(clock[q], t)
                pos[r] += 1
                changed = True
    return {r: _dump(job, r, ops[r], seq_of[r], enq[r], done) for r in ops}


def _index(seqs: list[int], ops: list[tuple[int, Op]], pg: str, seq: int) -> int | None:
    for k, (_, op) in enumerate(ops):
        if op.pg == pg and seqs[k] == seq:
            return k
    return None


def _dump(job: Job, r: int, ops: list[tuple[int, Op]], seqs: list[int], enq: list[float],
          done: set[tuple[int, int]]) -> dict[str, Any]:
    entries = []
    status: dict[str, dict[str, int]] = {}
    for k, t in enumerate(enq):
        op = ops[k][1]
        fin = (r, k) in done
        entries.append({
            "record_id": k, "pg_id": int(op.pg) if op.pg.isdigit() else 0,
            "process_group": (op.pg, "default_pg" if op.pg == "0" else f"g{op.pg}"),
            "collective_seq_id": seqs[k], "p2p_seq_id": 0, "op_id": seqs[k],
            "profiling_name": f"{job.backend}:{op.op}",
            "time_created_ns": int(t * 1e9), "input_sizes": [list(s) for s in op.sizes],
            "input_dtypes": [op.dtype], "output_sizes": [list(s) for s in op.sizes],
            "output_dtypes": [op.dtype],
            "state": ("completed" if fin and job.backend == "nccl" else "scheduled"),
            "retired": fin, "timeout_ms": 3000, "is_p2p": False, "frames": [],
        })
        st = status.setdefault(op.pg, {"last_enqueued_collective": 0,
                                       "last_started_collective": -1,
                                       "last_completed_collective": 0})
        st["last_enqueued_collective"] = seqs[k]
        if fin:
            st["last_completed_collective"] = seqs[k]
    return {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
            "pg_status": status, "entries": entries}


def evidence(job: Job, *, drop: tuple[int, ...] = (), dead: Mapping[int, str] | None = None,
             trigger: str = "stall", locations: Mapping[int, Any] | None = None,
             stacks: Mapping[int, str] | None = None) -> AnalysisInput:
    dumps = simulate(job)
    ranks = []
    for r in range(job.world):
        ranks.append(RankEvidence(
            rank=r, trace=None if r in drop else parse_dump(dumps[r], rank=r),
            alive=not (dead and r in dead),
            exit_info=(dead or {}).get(r), top_of_stack=(stacks or {}).get(r)))
    return AnalysisInput(ranks=tuple(ranks), world_size=job.world, pg_members=job.groups,
                         trigger=trigger, locations=locations or {})


def tp_dp_groups(world: int, tp: int) -> dict[str, tuple[int, ...]]:
    """pg "0" = world; then TP groups (consecutive ranks), then DP groups (stride tp)."""
    groups: dict[str, tuple[int, ...]] = {"0": tuple(range(world))}
    n = 1
    for start in range(0, world, tp):
        groups[str(n)] = tuple(range(start, start + tp))
        n += 1
    for off in range(tp):
        groups[str(n)] = tuple(range(off, world, tp))
        n += 1
    return groups
