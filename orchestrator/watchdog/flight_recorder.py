"""Normalise PyTorch Flight Recorder dumps into a small typed per-rank trace.

Pure module (stdlib only). Input is the dict that
`pickle.loads(torch._C._distributed_c10d._dump_fr_trace())` (gloo) or `_dump_nccl_trace()`
(NCCL) returns, or a dump file written by `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`. Every key is
optional: versions 2.2 .. 2.10 differ (nccl_version vs comm_lib_version, thread ids, durations),
gloo leaves `pg_config` empty and records no p2p ops, and entries are a ring buffer so the first
retained seq is not 1.

Completion: NCCL sets `state == "completed"`; gloo leaves `state == "scheduled"` forever and only
flips `retired` when the work finishes, so an entry is done when either says so, or when its seq
is at or below the group's `last_completed_collective`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from orchestrator.isolation.runfiles import plain_loads

_P2P_NAME_RE = re.compile(r"(send|recv)\s*(\d+)\s*(?:->|<-)\s*(\d+)")


@dataclass(frozen=True)
class FrEntry:
    pg: str
    pg_desc: str
    op: str  # "all_reduce", "send", "_allgather_base", ... (backend prefix stripped)
    backend: str  # "gloo" | "nccl" | ""
    collective_seq: int | None
    p2p_seq: int | None
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_sizes: tuple[tuple[int, ...], ...] = ()
    state: str = ""
    completed: bool = False
    time_created_ns: int | None = None
    peer: int | None = None  # p2p only, parsed from "nccl:send 0->1" when present
    frames: tuple[str, ...] = ()  # "fn at file:line", innermost first
    record_id: int | None = None

    def fingerprint(self) -> str:
        """What must agree across ranks at one seq: op, sizes and dtypes."""
        return f"{self.op} {_fmt_sizes(self.input_sizes)} {','.join(self.input_dtypes)}"

    def label(self) -> str:
        seq = self.p2p_seq if self.is_p2p else self.collective_seq
        return f"{self.op} #{seq}"


@dataclass(frozen=True)
class PgStatus:
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


@dataclass(frozen=True)
class PgConfig:
    name: str
    desc: str = ""
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class RankTrace:
    """One rank's Flight Recorder dump, normalised. Entries keep dump order."""

    rank: int | None
    version: str
    entries: tuple[FrEntry, ...]
    pg_status: Mapping[str, PgStatus] = field(default_factory=dict)
    pg_config: Mapping[str, PgConfig] = field(default_factory=dict)
    comm_lib_version: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pg_status", MappingProxyType(dict(self.pg_status)))
        object.__setattr__(self, "pg_config", MappingProxyType(dict(self.pg_config)))

    def pgs(self) -> tuple[str, ...]:
        seen = dict.fromkeys(self.pg_status)
        seen.update(dict.fromkeys(e.pg for e in self.entries))
        return tuple(seen)

    @cached_property
    def _by_pg(self) -> dict[str, dict[int, FrEntry]]:
        # Computed once: the analyzer asks per (rank, pg) several times, at 512 ranks.
        out: dict[str, dict[int, FrEntry]] = {}
        for e in self.entries:
            if not e.is_p2p and e.collective_seq is not None:
                out.setdefault(e.pg, {})[e.collective_seq] = e
        return out

    def collectives(self, pg: str) -> dict[int, FrEntry]:
        """seq -> entry for one group's collectives (the last record wins on a repeat)."""
        return self._by_pg.get(pg, {})

    def last_enqueued(self, pg: str) -> int | None:
        """Highest collective seq this rank enqueued on `pg`.

        Entries first: gloo's pg_status counts in op ids, which include send/recv, so its
        numbers run ahead of collective_seq_id once a group has carried p2p traffic (seen in
        tests/fixtures/fr/gloo_torch2.13_p2p_rank0.pkl). pg_status is used only when the ring
        buffer kept no entry for the group.
        """
        seqs = list(self.collectives(pg))
        if seqs:
            return max(seqs)
        st = self.pg_status.get(pg)
        if st and st.last_enqueued is not None and st.last_enqueued >= 0:
            return st.last_enqueued
        return None

    def last_completed(self, pg: str) -> int | None:
        entries = self.collectives(pg)
        if entries:
            done = [s for s, e in entries.items() if e.completed]
            if done:
                return max(done)
            first = min(entries)  # all retained entries pending: in-order completion
            return first - 1 if first > 1 else None
        st = self.pg_status.get(pg)
        if st and st.last_completed is not None and st.last_completed >= 0:
            return st.last_completed
        return None

    def pending(self, pg: str) -> list[FrEntry]:
        """Enqueued and not completed collectives and p2p ops on `pg`, oldest first."""
        done = self.last_completed(pg) or 0
        out = []
        for e in self.entries:
            if e.pg != pg or e.completed:
                continue
            if e.is_p2p or (e.collective_seq is not None and e.collective_seq > done):
                out.append(e)
        return out


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def _fmt_sizes(sizes: tuple[tuple[int, ...], ...]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sizes) + "]"


def _sizes(v: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(v, list | tuple):
        return ()
    out = []
    for s in v:
        if isinstance(s, list | tuple):
            out.append(tuple(i for i in (_int(x) for x in s) if i is not None))
    return tuple(out)


def _split_name(profiling_name: str) -> tuple[str, str, int | None]:
    """'nccl:send 0->1' -> ('nccl', 'send', 1); 'gloo:all_reduce' -> ('gloo', 'all_reduce',
    None)."""
    backend, _, op = profiling_name.partition(":")
    if not op:
        backend, op = "", backend
    peer = None
    m = _P2P_NAME_RE.search(op)
    if m:
        # "send 0->1": this group rank 0 sends to 1; "recv 0<-1": 0 receives from 1.
        peer = int(m.group(3))
        op = m.group(1)
    return backend.strip().lower(), op.strip().split(" ")[0], peer


def _pg_of(raw: Mapping[str, Any]) -> tuple[str, str]:
    pg = raw.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        return str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    pg_id = raw.get("pg_id")
    return (str(pg_id) if pg_id is not None else "0"), ""


def _frames(v: Any, limit: int = 8) -> tuple[str, ...]:
    out = []
    for f in (v or ())[:limit] if isinstance(v, list | tuple) else ():
        if isinstance(f, Mapping):
            out.append(f"{f.get('name', '?')} at {f.get('filename', '?')}:{f.get('line', '?')}")
    return tuple(out)


def parse_entry(raw: Mapping[str, Any]) -> FrEntry:
    backend, op, peer = _split_name(str(raw.get("profiling_name") or ""))
    pg, desc = _pg_of(raw)
    is_p2p = bool(raw.get("is_p2p")) or op in ("send", "recv")
    state = str(raw.get("state") or "")
    completed = state == "completed" or bool(raw.get("retired"))
    return FrEntry(
        pg=pg, pg_desc=desc, op=op or "?", backend=backend,
        collective_seq=_int(raw.get("collective_seq_id")),
        p2p_seq=_int(raw.get("p2p_seq_id")), is_p2p=is_p2p,
        input_sizes=_sizes(raw.get("input_sizes")),
        input_dtypes=tuple(str(d) for d in raw.get("input_dtypes") or ()),
        output_sizes=_sizes(raw.get("output_sizes")), state=state, completed=completed,
        time_created_ns=_int(raw.get("time_created_ns")), peer=peer,
        frames=_frames(raw.get("frames")), record_id=_int(raw.get("record_id")),
    )


def _parse_ranks(v: Any) -> tuple[int, ...]:
    if isinstance(v, list | tuple):
        return tuple(i for i in (_int(x) for x in v) if i is not None)
    return tuple(int(x) for x in re.findall(r"-?\d+", str(v or "")))


def parse_dump(raw: Mapping[str, Any], *, rank: int | None = None) -> RankTrace:
    """Normalise one dump. Unknown or malformed pieces are dropped, never raised on."""
    entries = []
    for e in raw.get("entries") or ():
        if isinstance(e, Mapping):
            entries.append(parse_entry(e))
    status = {}
    for pg, st in (raw.get("pg_status") or {}).items():
        if isinstance(st, Mapping):
            status[str(pg)] = PgStatus(
                last_enqueued=_int(st.get("last_enqueued_collective")),
                last_started=_int(st.get("last_started_collective")),
                last_completed=_int(st.get("last_completed_collective")))
    config = {}
    for pg, cfg in (raw.get("pg_config") or {}).items():
        if isinstance(cfg, Mapping) and str(pg) != "":
            config[str(pg)] = PgConfig(name=str(cfg.get("name", pg)),
                                       desc=str(cfg.get("desc", "")),
                                       ranks=_parse_ranks(cfg.get("ranks")))
    lib = raw.get("comm_lib_version") or raw.get("nccl_version") or ""
    return RankTrace(rank=rank if rank is not None else _int(raw.get("rank")),
                     version=str(raw.get("version", "")), entries=tuple(entries),
                     pg_status=status, pg_config=config, comm_lib_version=str(lib))


def load_dump(path: str | Path, *, rank: int | None = None) -> RankTrace:
    """Read a pickled dump file (what TORCH_NCCL_DEBUG_INFO_TEMP_FILE / the pipe writes).

    The rank defaults to the trailing integer of the file name ("trace_3" -> 3). A dump is
    plain data: it is unpickled without admitting any class (whoever wrote the file could
    otherwise run code in this process).
    Raises OSError / pickle errors on unreadable files; callers decide.
    """
    p = Path(path)
    raw = plain_loads(p.read_bytes())
    if rank is None:
        m = re.search(r"(\d+)(?:\.\w+)?$", p.name)
        rank = int(m.group(1)) if m else None
    return parse_dump(raw if isinstance(raw, Mapping) else {}, rank=rank)


MAX_SUMMARY_ENTRIES = 500


def jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return str(v)


def trim_dump(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the newest entries with their top frames: the summary travels over Ray."""
    out = {k: v for k, v in raw.items() if k != "entries"}
    entries = _this_job(list(raw.get("entries") or ()))
    # pg_status is keyed by an internal uid, entries by group name; they agree only in a fresh
    # process. Re-key through this job's entries and drop statuses of groups no entry names.
    names = {str(e.get("pg_id")): str((e.get("process_group") or ("",))[0]) for e in entries
             if isinstance(e, Mapping) and e.get("pg_id") is not None}
    out["pg_status"] = {names[uid]: st for uid, st in (raw.get("pg_status") or {}).items()
                        if str(uid) in names}
    entries = entries[-MAX_SUMMARY_ENTRIES:]
    out["entries"] = [{**e, "frames": list(e.get("frames") or ())[:4]} for e in entries]
    return jsonable(out)


def _this_job(entries: list[Any]) -> list[Any]:
    """Entries since the current default group began. The recorder is per process and has no
    reset: a reused (warm-pool) worker still holds the previous job's entries, whose group
    ids and seqs ("0", 1, 2, ...) collide with this job's. Seq 1 on the default group marks
    the start of a job; anything recorded before the newest one belongs to an older group."""
    start = 0
    for i, e in enumerate(entries):
        pg = e.get("process_group") if isinstance(e, Mapping) else None
        if pg and str(pg[0]) == "0" and e.get("collective_seq_id") == 1:
            start = i
    return entries[start:]
