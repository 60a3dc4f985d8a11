"""Single-line patterns for NCCL_DEBUG, PyTorch and gloo messages (see `logs`). Pure module.

`match(payload, meta)` returns (kind, fields) pairs for one record, prefixes already removed.
Patterns are written against several NCCL (2.4 .. 2.26) and PyTorch (1.9 .. 2.13) wordings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Fields = dict[str, Any]

NCCL_RE = re.compile(
    r"^(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<src>[\w./\-]+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT|ERROR) ?(?P<msg>.*)$")
_VERSION_RE = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)(?:\+cuda(?P<cuda>[\d.]+))?"
                         r"(?: compiled with CUDA (?P<cuda2>[\d.]+))?")
_INIT_RE = re.compile(
    r"(?:ncclCommInitRank\w* )?comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) n[Rr]anks (?P<n>\d+)"
    r"(?: nNodes (?P<nnodes>\d+))?(?:.*? cudaDev (?P<dev>\d+))?(?:.*? nvmlDev (?P<nvml>\d+))?"
    r"(?:.*? busId (?P<bus>[0-9a-fx]+))?(?:.*? commId (?P<commid>0x[0-9a-f]+))?"
    r"(?P<complete>.*Init COMPLETE)?")
_COLL_RE = re.compile(
    r"^(?P<op>[A-Z][A-Za-z]+): opCount (?P<opc>[0-9a-f]+)(?: sendbuff (?P<sb>\S+))?"
    r"(?: recvbuff (?P<rb>\S+))?(?: count (?P<count>\d+))?(?: datatype (?P<dt>\d+))?"
    r"(?: op (?P<redop>\d+))?(?: root (?P<root>-?\d+))?(?: comm (?P<comm>0x[0-9a-f]+))?"
    r"(?: \[nranks=(?P<n>\d+)\])?")
_RING_RE = re.compile(r"^Channel (?P<ch>\d+)/(?P<nch>\d+) :\s+(?P<ranks>[\d\s]+)$")
_PEER_CH_RE = re.compile(
    r"^Channel (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)\[(?P<sbus>[0-9a-fx]+)\] -> (?P<dst>\d+)"
    r"\[(?P<dbus>[0-9a-fx]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>\S+)")
_TREES_RE = re.compile(r"^Trees? (?P<body>(?:\[\d+\] \S+ ?)+)")
_CHANNELS_RE = re.compile(r"^(?P<coll>\d+) coll channels, (?:(?P<nvls>\d+) nvls channels, )?"
                          r"(?P<p2p>\d+) p2p channels")
_NET_RE = re.compile(r"^NET/(?P<t>IB|Socket|[\w]+) ?: Using (?P<devs>.+?)(?: ; OOB (?P<oob>\S+))?$")
_USING_NET_RE = re.compile(r"^Using network (?P<t>\w+)")
_BOOT_RE = re.compile(r"^Bootstrap ?: Using (?P<iface>[\w.\-]+):(?P<addr>[^<\s]+)")
_RET_RE = re.compile(r"^(?P<loc>[\w./\-]+:\d+) -> (?P<code>\d+)(?: \[(?P<ctx>[^\]]+)\])?")
_IB_RE = re.compile(r"Got completion from peer (?P<peer>\S+?) with (?:error )?status[= ]"
                    r"(?P<status>\d+)(?:.*?opcode[= ](?P<opc>\d+))?(?:.*?vendor err (?P<ve>\d+))?")

_WATCHDOG_RE = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: "
    r"Work\w+\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)(?:, NumelIn=(?P<nin>\d+))?"
    r"(?:, NumelOut=(?P<nout>\d+))?, Timeout\(ms\)=(?P<tmo>\d+)\)"
    r"(?: ran for (?P<ran>\d+) milliseconds)?")
_PG_PREFIX_RE = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)(?: PG GUID (?P<guid>[^ \]]+))?"
                           r"(?:\((?P<desc>[^)]*)\))? Rank (?P<rank>\d+)\]")
_LAST_WORK_RE = re.compile(
    r"(?:at (?:NCCL )?work(?: sequence id)?: (?P<at>\d+)[,.]?\s*(?:PG status: )?)?"
    r"last enqueued (?:NCCL )?work: (?P<enq>\d+), last completed (?:NCCL )?work: (?P<done>\d+)")
_HEARTBEAT_RE = re.compile(r"Heartbeat monitor timed out!.*?workMetaList_\.size\(\) ?= ?(?P<n>\d+)")
_STUCK_RE = re.compile(r"watchdog got stuck for (?P<s>\d+) seconds")
_MISMATCH_RE = re.compile(r"Detected mismatch between collectives on ranks\. "
                          r"Rank (?P<a>\d+) is running collective: (?P<fa>.*?), but Rank "
                          r"(?P<b>\d+) is running collective: (?P<fb>.*?)\.\s*Collectives differ "
                          r"in the following aspects:\s*(?P<detail>.*)$")
_FP_RE = re.compile(r"SequenceNumber=(?P<seq>\d+), OpType=(?P<op>\w+)(?:, TensorShape="
                    r"(?P<shape>\[[^\]]*\]))?(?:, TensorDtypes=(?P<dt>[\w, ]+?))?(?:,|\))")
_GLOO_TMO_RE = re.compile(r"\[(?P<src>[^\]]*?(?:gloo|transport)[^\]]*?:\d+)\] Timed out waiting "
                          r"(?P<ms>\d+)ms for (?P<op>\w+) operation to complete")
_MB_RE = re.compile(r"Rank (?P<rank>\d+) failed to pass monitoredBarrier in (?P<ms>\d+) ms")
_GLOO_CLOSED_RE = re.compile(r"(?:Connection closed by peer|Read error|Connection reset by peer)"
                             r"[^\[]*(?:\[(?P<peer>[^\]]+)\]:(?P<port>\d+))?")
_GLOO_SIZE_RE = re.compile(r"Received data size doesn't match expected size")


def _i(v: str | None, base: int = 10) -> int | None:
    return int(v, base) if v not in (None, "") else None


def nccl_category(msg: str) -> str:
    low = msg.lower()
    if "got completion from peer" in low or "ibv_poll_cq" in low:
        return "ib_completion_error"
    if "connection closed" in low or "socket recv failed" in low or "connection reset" in low:
        return "connection_closed"
    if "cuda failure" in low or "cuda error" in low or "cudaerror" in low:
        return "cuda_error"
    if "system error" in low or "call to" in low and "failed" in low:
        return "system_error"
    return "other"


def _nccl_info(msg: str, base: Fields) -> list[tuple[str, Fields]]:
    if m := _VERSION_RE.search(msg):
        return [("nccl_version", {**base, "version": m.group("v"),
                                  "cuda": m.group("cuda") or m.group("cuda2")})]
    if m := _COLL_RE.match(msg):
        truncated = m.group("n") is None
        return [("nccl_coll", {**base, "op": m.group("op"), "op_count": _i(m.group("opc"), 16),
                               "count": _i(m.group("count")), "datatype": _i(m.group("dt")),
                               "red_op": _i(m.group("redop")), "root": _i(m.group("root")),
                               "comm": m.group("comm"), "nranks": _i(m.group("n")),
                               "truncated": truncated})]
    if "rank" in msg and (m := _INIT_RE.search(msg)) and ("Init" in msg or "cudaDev" in msg):
        return [("nccl_init", {**base, "rank": int(m.group("rank")), "nranks": int(m.group("n")),
                               "cuda_dev": _i(m.group("dev")), "nvml_dev": _i(m.group("nvml")),
                               "bus_id": m.group("bus"), "comm": m.group("comm"),
                               "comm_id": m.group("commid"),
                               "complete": bool(m.group("complete"))})]
    for rx, kind, conv in _INFO_TABLE:
        if m := rx.match(msg):
            return [(kind, {**base, **conv(m)})]
    return []


def _ring(m: re.Match[str]) -> Fields:
    return {"channel": int(m.group("ch")), "nchannels": int(m.group("nch")),
            "ranks": [int(x) for x in m.group("ranks").split()]}


def _peer(m: re.Match[str]) -> Fields:
    via = m.group("via")
    return {"channel": int(m.group("ch")), "src": int(m.group("src")),
            "dst": int(m.group("dst")), "direction": m.group("dir"), "via": via,
            "transport": _transport(via)}


def _transport(via: str) -> str:
    v = via.upper()
    if "NET/IB" in v or v.startswith("IB"):
        return "IB"
    if "SOCKET" in v:
        return "Socket"
    if v.startswith("P2P"):
        return "P2P"
    if v.startswith("SHM"):
        return "SHM"
    if "NVLS" in v:
        return "NVLS"
    return via.split("/")[0]


_INFO_TABLE: list[tuple[re.Pattern[str], str, Callable[[re.Match[str]], Fields]]] = [
    (_RING_RE, "nccl_ring", _ring),
    (_PEER_CH_RE, "nccl_channel", _peer),
    (_TREES_RE, "nccl_tree", lambda m: {"trees": len(re.findall(r"\[\d+\]", m.group("body")))}),
    (_CHANNELS_RE, "nccl_channels", lambda m: {"coll_channels": int(m.group("coll")),
                                               "p2p_channels": int(m.group("p2p"))}),
    (_NET_RE, "nccl_net", lambda m: {"transport": m.group("t"),
                                     "devices": re.findall(r"\[\d+\]([\w.:/\-]+)",
                                                           m.group("devs")),
                                     "oob": m.group("oob")}),
    (_USING_NET_RE, "nccl_net", lambda m: {"transport": m.group("t")}),
    (_BOOT_RE, "nccl_bootstrap", lambda m: {"interface": m.group("iface"),
                                            "address": m.group("addr")}),
    (_RET_RE, "nccl_retcode", lambda m: {"location": m.group("loc"),
                                         "code": int(m.group("code")),
                                         "context": m.group("ctx")}),
]


def _nccl(m: re.Match[str]) -> list[tuple[str, Fields]]:
    base: Fields = {"host": m.group("host"), "pid": int(m.group("pid")),
                    "tid": int(m.group("tid")), "cuda_dev": int(m.group("dev"))}
    msg = m.group("msg").strip()
    if m.group("level") in ("WARN", "ABORT", "ERROR"):
        fields: Fields = {**base, "message": msg, "source": m.group("src"),
                          "category": nccl_category(msg)}
        if ib := _IB_RE.search(msg):
            fields.update(ib_status=int(ib.group("status")), peer=ib.group("peer"),
                          vendor_err=_i(ib.group("ve")))
        return [("nccl_warn", fields)]
    return _nccl_info(msg, base)


def _torch(payload: str, meta: Mapping[str, Any]) -> list[tuple[str, Fields]]:
    out: list[tuple[str, Fields]] = []
    pg = _PG_PREFIX_RE.search(payload)
    rank = int(pg.group("rank")) if pg else meta.get("launcher_rank")
    pgf: Fields = {"pg": pg.group("pg"), "pg_desc": pg.group("desc")} if pg else {}
    if m := _WATCHDOG_RE.search(payload):
        out.append(("torch_watchdog_timeout", {
            "rank": _i(m.group("rank")) if m.group("rank") else rank, "seq": _i(m.group("seq")),
            "op_type": m.group("op"), "numel_in": _i(m.group("nin")),
            "numel_out": _i(m.group("nout")), "timeout_ms": int(m.group("tmo")),
            "ran_ms": _i(m.group("ran"))}))
    if m := _LAST_WORK_RE.search(payload):
        out.append(("torch_last_work", {"rank": rank, **pgf, "failed_seq": _i(m.group("at")),
                                        "last_enqueued": int(m.group("enq")),
                                        "last_completed": int(m.group("done"))}))
    if m := _HEARTBEAT_RE.search(payload):
        out.append(("heartbeat_timeout", {"rank": rank, **pgf,
                                          "work_meta_list_size": int(m.group("n"))}))
    if m := _STUCK_RE.search(payload):
        out.append(("heartbeat_stuck", {"rank": rank, **pgf, "seconds": int(m.group("s"))}))
    if m := _MISMATCH_RE.search(payload):
        fa, fb = _FP_RE.search(m.group("fa")), _FP_RE.search(m.group("fb"))
        out.append(("collective_mismatch", {
            "ranks": [int(m.group("a")), int(m.group("b"))],
            "seq": _i(fa.group("seq")) if fa else None,
            "detail": re.sub(r"\s+", " ", m.group("detail")).strip(),
            "fingerprints": {m.group("a"): _fp(fa), m.group("b"): _fp(fb)}}))
    return out


def _fp(m: re.Match[str] | None) -> Fields:
    if m is None:
        return {}
    return {"op_type": m.group("op"), "shape": m.group("shape"),
            "dtypes": (m.group("dt") or "").strip() or None}


def _gloo(payload: str, meta: Mapping[str, Any]) -> list[tuple[str, Fields]]:
    rank = meta.get("launcher_rank")
    if m := _GLOO_TMO_RE.search(payload):
        return [("gloo_timeout", {"rank": rank, "op": m.group("op"),
                                  "timeout_ms": int(m.group("ms")),
                                  "source": m.group("src").rsplit("/", 1)[-1]})]
    if m := _MB_RE.search(payload):
        return [("monitored_barrier_failure", {"rank": int(m.group("rank")),
                                               "timeout_ms": int(m.group("ms"))})]
    if _GLOO_SIZE_RE.search(payload):
        return [("collective_mismatch", {"ranks": [], "seq": None,
                                         "detail": payload.split("] ", 1)[-1].strip()})]
    gloo = "gloo" in payload.lower() or "pair.cc" in payload
    if gloo and (m := _GLOO_CLOSED_RE.search(payload)):
        return [("gloo_connection_closed", {"rank": rank, "peer": m.group("peer"),
                                                "port": _i(m.group("port"))})]
    return []


def match(payload: str, meta: Mapping[str, Any]) -> list[tuple[str, Fields]]:
    if m := NCCL_RE.match(payload):
        return _nccl(m)
    if m := _VERSION_RE.match(payload):
        return [("nccl_version", {"version": m.group("v"),
                                  "cuda": m.group("cuda") or m.group("cuda2")})]
    out = _torch(payload, meta)
    return out or _gloo(payload, meta)
