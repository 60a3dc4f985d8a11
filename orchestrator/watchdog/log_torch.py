"""Single-line PyTorch and gloo messages, whole or cut (see `logs`). Pure module.

Each kind is found by its anchor, the words that say what the message is ("Watchdog caught
collective operation timeout", "Detected mismatch between collectives on ranks"), searched
anywhere in the record; the fields after it are read one at a time, each optional, so a
message cut by a log shipper's line limit or a copy into an issue tracker still yields what
it holds. A message that stops before its end marker (the ")" closing the work descriptor,
"Collectives differ in the following aspects", "operation to complete", ...) gets
`partial: True`, and `cut` names the field the cut ran into: a number there is kept (its
last digits may be missing), a word there is dropped (a cut "ALLRED" is no op type).

Every pattern is linear in the record's length: anchors are literal words, and the scans
after them stop at delimiters that cannot restart a match.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchestrator.watchdog.log_prefixes import rank_in_prefix

Fields = dict[str, Any]
Events = list[tuple[str, Fields]]

# "[PG 1 Rank 3]", "[PG 0 (default_pg) Rank 1]", "[PG ID 0 PG GUID 0(default_pg) Rank 1]"
_PG_PREFIX_RE = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)(?: PG GUID (?P<guid>[^ \[\]\n]+))?"
                           r"(?: ?\((?P<desc>[^()\[\]\n]*)\))? Rank (?P<rank>\d+)\]")
_WD_RE = re.compile(r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout")
_WORK_RE = re.compile(r": Work\w*\(")
_KV_RE = re.compile(r"(?P<k>\w+(?:\(ms\))?)=(?P<v>[^,()\s]*)(?P<sep>, |\)|$)")
_RAN_RE = re.compile(r" ran for (?P<ran>\d+) milliseconds")
_WORK_KEYS = {"SeqNum": ("seq", int), "OpType": ("op_type", str), "NumelIn": ("numel_in", int),
              "NumelOut": ("numel_out", int), "Timeout(ms)": ("timeout_ms", int)}
_LAST_WORK_RE = re.compile(
    r"(?:at (?:NCCL )?work(?: sequence id)?: (?P<at>\d+)[,.]?\s*(?:PG status: )?)?"
    r"last enqueued (?:NCCL )?work: (?P<enq>\d+)")
_LAST_DONE_RE = re.compile(r", last completed (?:NCCL )?work: (?P<done>\d+)")
_HEARTBEAT_RE = re.compile(r"Heartbeat monitor timed out!")
_HB_SIZE_RE = re.compile(r"workMetaList_\.size\(\) ?= ?(?P<n>\d+)")
_STUCK_RE = re.compile(r"watchdog got stuck for(?: (?P<s>\d+)(?P<end> seconds)?)?")
_MISMATCH_RE = re.compile(r"Detected mismatch between collectives on ranks")
_RANK_RUNS_RE = re.compile(r"\.?\s*Rank (?P<r>\d+) is running (?P<inc>inconsistent )?"
                           r"collective: ")
_BUT_RE = re.compile(r"(?P<r>\d+)(?: is running collective: )?")
_DIFFER = "Collectives differ in the following aspects:"
_SEQ_IS_RE = re.compile(r"The sequence number is: (?P<seq>\d+)")
_FP_FIELDS = (("seq", re.compile(r"SequenceNumber=(\d+)"), int),
              ("op_type", re.compile(r"OpType=(\w+)"), str),
              ("shape", re.compile(r"TensorShape=(\[[^\]\[]*\])"), str),
              ("dtypes", re.compile(r"TensorDtypes=([\w ,]*?)(?:, TensorDeviceTypes|\)|$)"), str))
_GLOO_TMO_RE = re.compile(r"\] Timed out waiting(?: (?P<ms>\d+)ms(?: for (?P<op>\w+)"
                          r"(?P<end> operation)?)?)?")
_MB_RE = re.compile(r"Rank (?P<rank>\d+) failed to pass monitoredBarrier(?: in (?P<ms>\d+)"
                    r"(?P<end> ms)?)?")
_GLOO_CLOSED_RE = re.compile(r"(?:Connection closed by peer|Read error|Connection reset by peer)"
                             r"[^\[]*(?:\[(?P<peer>[^\]]+)\]:(?P<port>\d+))?")
_GLOO_SIZE_RE = re.compile(r"Received data size doesn't match expected size")


def _end(text: str) -> int:
    return len(text.rstrip())


def _value(raw: str, kind: type, *, at_cut: bool) -> Any:
    """A field's value; a word the cut ran into is no value."""
    if kind is int:
        return int(raw) if raw.isdigit() else None
    return None if at_cut or not raw else raw


def _cut_of(m: re.Match[str], end: int, groups: tuple[tuple[str, str], ...]) -> str | None:
    """The field whose value the cut ran into: the last group of `m` reaching `end`."""
    hit = [name for g, name in groups if m.group(g) is not None and m.end(g) >= end]
    return hit[-1] if hit else None


def _rank(payload: str, start: int, pg: re.Match[str] | None,
          meta: Mapping[str, Any]) -> int | None:
    """The rank a PyTorch line is about: its "[PG 0 Rank 3]" tag, else the launcher's, else a
    rank in the text before the message."""
    if pg:
        return int(pg.group("rank"))
    r = meta.get("launcher_rank")
    return r if isinstance(r, int) else rank_in_prefix(payload[:start])


def _partial(fields: Fields, *, complete: bool, cut: str | None) -> Fields:
    if not complete:
        fields["partial"] = True
        if cut:
            fields["cut"] = cut
    return fields


def _watchdog(s: str, m: re.Match[str], rank: int | None) -> Fields:
    f: Fields = {"rank": int(m.group("rank")) if m.group("rank") else rank, "seq": None,
                 "op_type": None, "numel_in": None, "numel_out": None, "timeout_ms": None,
                 "ran_ms": None}
    end, cut, complete = _end(s), None, False
    w = _WORK_RE.match(s, m.end())
    pos = w.end() if w else len(s)
    while w and (kv := _KV_RE.match(s, pos)):
        at_cut = kv.group("sep") == "" and kv.end("v") >= end
        if kv.group("k") in _WORK_KEYS:
            name, kind = _WORK_KEYS[kv.group("k")]
            f[name] = _value(kv.group("v"), kind, at_cut=at_cut)
            cut = name if at_cut else cut
        pos = kv.end()
        if kv.group("sep") != ", ":
            complete = kv.group("sep") == ")"
            break
    if complete and (ran := _RAN_RE.match(s, pos)):
        f["ran_ms"] = int(ran.group("ran"))
    return _partial(f, complete=complete, cut=cut)


def _last_work(s: str, m: re.Match[str], rank: int | None, pgf: Fields) -> Fields:
    done = _LAST_DONE_RE.match(s, m.end())
    f: Fields = {"rank": rank, **pgf, "failed_seq": int(m.group("at")) if m.group("at") else None,
                 "last_enqueued": int(m.group("enq")),
                 "last_completed": int(done.group("done")) if done else None}
    cut = "last_enqueued" if not done and m.end("enq") >= _end(s) else None
    return _partial(f, complete=done is not None, cut=cut)


def _heartbeat(s: str, m: re.Match[str], rank: int | None, pgf: Fields) -> Fields:
    n = _HB_SIZE_RE.search(s, m.end())
    return _partial({"rank": rank, **pgf,
                     "work_meta_list_size": int(n.group("n")) if n else None},
                    complete=n is not None, cut=None)


def _stuck(s: str, m: re.Match[str], rank: int | None, pgf: Fields) -> Fields:
    secs = int(m.group("s")) if m.group("s") else None
    cut = _cut_of(m, _end(s), (("s", "seconds"),))
    return _partial({"rank": rank, **pgf, "seconds": secs}, complete=bool(m.group("end")),
                    cut=cut)


def _closed(text: str) -> bool:
    """A fingerprint's text ends where its parentheses close (or it is a bare op name, as
    old PyTorch printed the second rank's)."""
    t = text.strip().rstrip(".").strip()
    return ("(" in t and t.count("(") == t.count(")")) or bool(re.fullmatch(r"[A-Z_]+", t))


def _fingerprint(text: str, *, cut: bool) -> Fields:
    """CollectiveFingerPrint(...) fields; a fingerprint the cut ran into is `partial`."""
    bare = text.strip().rstrip(".").strip()
    if not cut and re.fullmatch(r"[A-Z_]+", bare):
        return {"op_type": bare, "shape": None, "dtypes": None}
    out: Fields = {}
    end = _end(text)
    for name, rx, kind in _FP_FIELDS:
        if fm := rx.search(text):
            val = _value(fm.group(1).strip(), kind, at_cut=cut and fm.end(1) >= end)
            if val is not None:
                out[name] = val
    if not out:
        return {}
    fp: Fields = {"op_type": out.get("op_type"), "shape": out.get("shape"),
                  "dtypes": out.get("dtypes") or None}
    if cut:
        fp["partial"] = True
    if "seq" in out:
        fp["_seq"] = out["seq"]
    return fp


def _mismatch(s: str, m: re.Match[str]) -> Fields:
    """'Rank A is running collective: FP_A, but Rank B is running collective: FP_B.
    Collectives differ in the following aspects: ...' (older PyTorch: 'Rank A is running
    inconsistent collective: FP_A'), read up to wherever the text stops."""
    ranks: list[int] = []
    fps: dict[str, Fields] = {}
    end, cut, detail, complete = _end(s), None, None, False
    differ = s.find(_DIFFER, m.end())
    if differ >= 0:
        detail = re.sub(r"\s+", " ", s[differ + len(_DIFFER):]).strip()
    body_end = differ if differ >= 0 else len(s)
    if a := _RANK_RUNS_RE.match(s, m.end()):
        ranks.append(int(a.group("r")))
        but = s.find(", but Rank ", a.end(), body_end)
        fa = s[a.end():but if but >= 0 else body_end]
        done_a = but >= 0 or differ >= 0 or _closed(fa)
        fps[a.group("r")] = _fingerprint(fa, cut=not done_a)
        complete = differ >= 0 or (bool(a.group("inc")) and but < 0 and _closed(fa))
        if but >= 0 and (b := _BUT_RE.match(s, but + len(", but Rank "))):
            ranks.append(int(b.group("r")))
            cut = "ranks" if b.end("r") >= end else None
            fb = s[b.end():body_end]
            done_b = differ >= 0 or (b.end() > b.end("r") and _closed(fb)
                                     and fb.rstrip().endswith("."))
            fps[b.group("r")] = _fingerprint(fb, cut=not done_b)
            complete = complete or done_b
    seqs = [fp.pop("_seq") for fp in fps.values() if "_seq" in fp]
    seq_is = _SEQ_IS_RE.search(s, m.end())
    seq = seqs[0] if seqs else (int(seq_is.group("seq")) if seq_is else None)
    f: Fields = {"ranks": ranks, "seq": seq, "detail": detail, "fingerprints": fps}
    return _partial(f, complete=complete, cut=cut)


def torch_events(payload: str, meta: Mapping[str, Any]) -> Events:
    out: Events = []
    pg = _PG_PREFIX_RE.search(payload)
    pgf: Fields = {"pg": pg.group("pg"), "pg_desc": pg.group("desc")} if pg else {}
    if m := _WD_RE.search(payload):
        out.append(("torch_watchdog_timeout",
                    _watchdog(payload, m, _rank(payload, m.start(), pg, meta))))
    if m := _LAST_WORK_RE.search(payload):
        out.append(("torch_last_work",
                    _last_work(payload, m, _rank(payload, m.start(), pg, meta), pgf)))
    if m := _HEARTBEAT_RE.search(payload):
        out.append(("heartbeat_timeout",
                    _heartbeat(payload, m, _rank(payload, m.start(), pg, meta), pgf)))
    if m := _STUCK_RE.search(payload):
        out.append(("heartbeat_stuck",
                    _stuck(payload, m, _rank(payload, m.start(), pg, meta), pgf)))
    if m := _MISMATCH_RE.search(payload):
        out.append(("collective_mismatch", _mismatch(payload, m)))
    return out


def _gloo_timeout(payload: str, meta: Mapping[str, Any]) -> Fields | None:
    for m in _GLOO_TMO_RE.finditer(payload):
        b = payload.rfind("[", max(0, m.start() - 400), m.start())
        src = payload[b + 1:m.start()] if b >= 0 else ""
        if not re.search(r":\d+$", src) or not ("gloo" in src or "transport" in src):
            continue
        ms, op = m.group("ms"), m.group("op")
        cut = _cut_of(m, _end(payload), (("ms", "timeout_ms"), ("op", "op")))
        f: Fields = {"rank": _rank(payload, m.start(), None, meta),
                     "op": op if cut != "op" else None,
                     "timeout_ms": int(ms) if ms else None,
                     "source": src.rsplit("/", 1)[-1]}
        return _partial(f, complete=bool(m.group("end")), cut=cut)
    return None


def gloo_events(payload: str, meta: Mapping[str, Any]) -> Events:
    if (f := _gloo_timeout(payload, meta)) is not None:
        return [("gloo_timeout", f)]
    if m := _MB_RE.search(payload):
        cut = _cut_of(m, _end(payload), (("ms", "timeout_ms"),))
        return [("monitored_barrier_failure", _partial(
            {"rank": int(m.group("rank")), "timeout_ms": int(m.group("ms")) if m.group("ms")
             else None}, complete=bool(m.group("end")), cut=cut))]
    if _GLOO_SIZE_RE.search(payload):
        return [("collective_mismatch", {"ranks": [], "seq": None,
                                         "detail": payload.split("] ", 1)[-1].strip()})]
    gloo = "gloo" in payload.lower() or "pair.cc" in payload
    if gloo and (m := _GLOO_CLOSED_RE.search(payload)):
        port = int(m.group("port")) if m.group("port") else None
        return [("gloo_connection_closed", {"rank": _rank(payload, m.start(), None, meta),
                                            "peer": m.group("peer"), "port": port})]
    return []
