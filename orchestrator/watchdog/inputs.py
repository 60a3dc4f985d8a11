"""What the analyzer takes: per-rank evidence, world size, group membership, rank locations.

Pure module. `RankEvidence.from_summary()` reads the JSON-able dict that
`workers.host.evidence.collect_evidence()` returns (plus liveness the controller adds), so the
worker side and the analyzer share one format without the analyzer importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestrator.watchdog.flight_recorder import RankTrace, parse_dump
from orchestrator.watchdog.report import RankLocation

DEFAULT_PG = "0"


@dataclass(frozen=True)
class PendingOp:
    """A collective or p2p op a rank is blocked in or about to run.

    Sources: "stack" (seen in the main thread's frames by the diagnostics thread), "announce"
    (recorded by the worker right before the call — the only evidence left when gloo aborts the
    process on a size mismatch), "heartbeat". `peer` is a GLOBAL rank; `seq` is the collective
    seq on `pg` when known.
    """

    op: str
    pg: str = DEFAULT_PG
    seq: int | None = None
    is_p2p: bool = False
    peer: int | None = None
    sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    source: str = "stack"

    def fingerprint(self) -> str:
        sizes = "[" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in self.sizes) + "]"
        return f"{self.op} {sizes} {','.join(self.dtypes)}"

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PendingOp:
        return PendingOp(
            op=str(d.get("op", "?")), pg=str(d.get("pg", DEFAULT_PG)),
            seq=_opt_int(d.get("seq")), is_p2p=bool(d.get("is_p2p", False)),
            peer=_opt_int(d.get("peer")),
            sizes=tuple(tuple(int(x) for x in s) for s in d.get("sizes") or ()),
            dtypes=tuple(str(x) for x in d.get("dtypes") or ()),
            source=str(d.get("source", "stack")))


@dataclass(frozen=True)
class RankEvidence:
    rank: int
    alive: bool | None = True  # None: unknown (no answer, no exit seen)
    exit_info: str | None = None
    exit_time_s: float | None = None
    trace: RankTrace | None = None
    pending: tuple[PendingOp, ...] = ()
    step: int | None = None
    phase: str | None = None
    heartbeat_age_s: float | None = None
    top_of_stack: str | None = None
    user_frame: str | None = None  # innermost frame of the user's own code (user-code jobs)
    stack: str | None = None
    log_errors: tuple[str, ...] = ()
    # Time each collective was entered, keyed by (pg, seq), in seconds on a shared clock.
    enter_times: Mapping[tuple[str, int], float] = field(default_factory=dict)
    artifacts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "enter_times", MappingProxyType(dict(self.enter_times)))

    @staticmethod
    def from_summary(d: Mapping[str, Any], **overrides: Any) -> RankEvidence:
        """Build from `collect_evidence()`'s summary dict; keyword overrides win (liveness)."""
        fr = d.get("fr_dump")
        trace = parse_dump(fr, rank=_opt_int(d.get("rank"))) if isinstance(fr, Mapping) else None
        enter = {}
        for item in d.get("enter_times") or ():
            enter[(str(item[0]), int(item[1]))] = float(item[2])
        kw: dict[str, Any] = dict(
            rank=int(d["rank"]), alive=d.get("alive", True), exit_info=d.get("exit_info"),
            exit_time_s=d.get("exit_time_s"), trace=trace,
            pending=tuple(PendingOp.from_dict(p) for p in d.get("pending") or ()),
            step=_opt_int(d.get("step")), phase=d.get("phase"),
            heartbeat_age_s=d.get("heartbeat_age_s"), top_of_stack=d.get("top_of_stack"),
            user_frame=d.get("user_frame"),
            stack=d.get("main_stack"), log_errors=tuple(d.get("log_errors") or ()),
            enter_times=enter, artifacts=tuple(d.get("artifacts") or ()))
        kw.update(overrides)
        return RankEvidence(**kw)


@dataclass(frozen=True)
class AnalysisInput:
    """`pg_members` maps a Flight Recorder pg id ("0" is the default group, then creation
    order) to its GLOBAL ranks in group-rank order. Missing groups fall back to the dump's
    pg_config, then to the ranks whose dumps mention the group. `trigger` says why the
    analysis runs: stall | straggler | exit | manual."""

    ranks: tuple[RankEvidence, ...]
    world_size: int
    pg_members: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pg_names: Mapping[str, str] = field(default_factory=dict)
    locations: Mapping[int, RankLocation] = field(default_factory=dict)
    trigger: str = "stall"
    artifacts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "pg_members", MappingProxyType(
            {str(k): tuple(v) for k, v in self.pg_members.items()}))
        object.__setattr__(self, "pg_names", MappingProxyType(dict(self.pg_names)))
        object.__setattr__(self, "locations", MappingProxyType(dict(self.locations)))


def _opt_int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def analysis_input(summaries: Mapping[int, Mapping[str, Any]], *, world_size: int,
                   dead: Mapping[int, str] | None = None,
                   exit_times: Mapping[int, float] | None = None,
                   announcements: Mapping[int, Mapping[str, Any]] | None = None,
                   locations: Mapping[int, RankLocation] | None = None,
                   trigger: str = "stall", artifacts: tuple[str, ...] = ()) -> AnalysisInput:
    """The controller's one call: summaries of the ranks that answered, exit info of the
    dead (with their last announcement), and group membership merged from the summaries'
    `process_groups` (keyed by group_name, as the Flight Recorder keys groups). `exit_times`:
    when each dead rank ended (seconds on one clock), which orders the dead."""
    ranks: list[RankEvidence] = []
    members: dict[str, tuple[int, ...]] = {}
    names: dict[str, str] = {}
    for r, s in sorted(summaries.items()):
        ranks.append(RankEvidence.from_summary(s, alive=True, rank=r))
        for pg, info in (s.get("process_groups") or {}).items():
            if info.get("ranks"):
                members.setdefault(str(pg), tuple(int(x) for x in info["ranks"]))
            if info.get("desc"):
                names.setdefault(str(pg), str(info["desc"]))
    for r, info in sorted((dead or {}).items()):
        if r in summaries:
            continue
        ann = (announcements or {}).get(r)
        ranks.append(RankEvidence(rank=r, alive=False, exit_info=info,
                                  exit_time_s=(exit_times or {}).get(r),
                                  pending=(PendingOp.from_dict(ann),) if ann else ()))
    return AnalysisInput(ranks=tuple(ranks), world_size=world_size, pg_members=members,
                         pg_names=names, locations=locations or {}, trigger=trigger,
                         artifacts=artifacts)


def _op_index(summary: Mapping[str, Any], pg: str) -> list[tuple[int, int]]:
    """(op_id, collective_seq) of a rank's recorded collectives on `pg`, by op id."""
    fr = summary.get("fr_dump")
    out = []
    for e in (fr.get("entries") or ()) if isinstance(fr, Mapping) else ():
        grp = e.get("process_group") or ("",)
        if str(grp[0]) != pg or e.get("is_p2p") or e.get("op_id") is None:
            continue
        seq = _opt_int(e.get("collective_seq_id"))
        if seq:
            out.append((int(e["op_id"]), seq))
    return sorted(out)


def seq_for_op(index: list[tuple[int, int]], op_id: int) -> int:
    """The collective seq the op with `op_id` gets: one past the newest recorded collective
    with a lower op id. gloo's pg_status counts send/recv in op ids, the Flight Recorder's
    collective seq does not; with no record, op id and seq are the same count."""
    below = [seq for oid, seq in index if oid < op_id]
    return (max(below) + 1) if below else (op_id if not index else 1)


def resolve_announcements(summaries: Mapping[int, Mapping[str, Any]],
                          announcements: Mapping[int, Mapping[str, Any]]
                          ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """Give announced ops (which carry the cheap op id) their collective seq, from the rank's
    own Flight Recorder entries when it has them, else from any peer's (ranks run the same op
    sequence up to a divergence)."""
    peers = {r: _op_index(s, "0") for r, s in summaries.items()}
    fallback = max(peers.values(), key=len, default=[])

    def fix(rank: int, ann: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(ann)
        if out.get("seq") is None and out.get("op_id") is not None and not out.get("is_p2p"):
            index = peers.get(rank) or fallback
            out["seq"] = seq_for_op(index, int(out["op_id"]))
        return out

    new_sums = {}
    for r, s in summaries.items():
        d = dict(s)
        d["pending"] = [fix(r, p) if p.get("source") == "announce" else p
                        for p in s.get("pending") or ()]
        new_sums[r] = d
    return new_sums, {r: fix(r, a) for r, a in announcements.items()}
