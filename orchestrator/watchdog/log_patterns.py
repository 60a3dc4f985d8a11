"""Single-line patterns for NCCL_DEBUG lines, and the dispatch to PyTorch / gloo messages
(`log_torch`) (see `logs`). Pure module.

`match(payload, meta)` returns (kind, fields) pairs for one record, known prefixes already
removed. Patterns are written against several NCCL (2.4 .. 2.27) and PyTorch (1.9 .. 2.13)
wordings, and stay linear in the record's length.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.watchdog import log_torch
from orchestrator.watchdog.log_prefixes import rank_in_prefix

Fields = dict[str, Any]

# `host:pid:tid [dev] [elapsed-ms ]file:line NCCL LEVEL msg` (TRACE adds the elapsed time).
# The look-behind starts a match only where a host name starts, which keeps `search` linear.
NCCL_RE = re.compile(
    r"(?<![\w.\-])(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:\d+\.\d+ )?(?:(?P<src>[\w./\-]+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT|ERROR)"
    r" ?(?P<msg>.*)$")
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
_RING_RE = re.compile(r"^Channel (?P<ch>\d+)/(?P<nch>\d+) :\s+(?P<ranks>\d[\d\s]*)$")
_PEER_CH_RE = re.compile(
    r"^Channel (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)\[(?P<sbus>[0-9a-fx]+)\] -> (?P<dst>\d+)"
    r"\[(?P<dbus>[0-9a-fx]+)\](?: \[(?P<dir>send|receive)\])?(?: via (?P<via>\S+))?")
_TREES_RE = re.compile(r"^Trees? (?P<body>(?:\[\d+\] \S+ ?)+)")
_CHANNELS_RE = re.compile(r"^(?P<coll>\d+) coll channels, (?:(?P<nvls>\d+) nvls channels, )?"
                          r"(?P<p2p>\d+) p2p channels")
_NET_RE = re.compile(r"^NET/(?P<t>IB|Socket|[\w]+) ?: Using (?P<devs>.+?)(?: ; OOB (?P<oob>\S+))?$")
_USING_NET_RE = re.compile(r"^Using network (?P<t>\w+)")
_BOOT_RE = re.compile(r"^Bootstrap ?: Using (?P<iface>[\w.\-]+):(?P<addr>[^<\s]+)")
_RET_RE = re.compile(r"^(?P<loc>[\w./\-]+:\d+) -> (?P<code>\d+)(?: \[(?P<ctx>[^\]]+)\])?")
_IB_RE = re.compile(r"Got completion from peer (?P<peer>\S+?) with (?:error )?status[= ]"
                    r"(?P<status>\d+)(?:.*?opcode[= ](?P<opc>\d+))?(?:.*?vendor err (?P<ve>\d+))?")

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
            "transport": _transport(via) if via else None}


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


def match(payload: str, meta: Mapping[str, Any]) -> list[tuple[str, Fields]]:
    """Events of one record. An NCCL record is found wherever its `host:pid:tid [dev] NCCL`
    structure starts; a rank in the unrecognised text before it is kept as `launcher_rank`."""
    if m := NCCL_RE.search(payload):
        events = _nccl(m)
        if m.start() and "launcher_rank" not in meta:
            rank = rank_in_prefix(payload[:m.start()])
            if rank is not None:
                events = [(k, {"launcher_rank": rank, **f}) for k, f in events]
        return events
    # NCCL's own VERSION line starts the record; after unknown text it must name its CUDA
    # (PyTorch quotes a bare "NCCL version 2.21.5" inside its errors).
    m = _VERSION_RE.search(payload)
    before = payload[:m.start()] if m else ""
    cuda = bool(m and (m.group("cuda") or m.group("cuda2")))
    if m and (not before.strip() or (cuda and before[-1] in " \t:]>|")):
        return [("nccl_version", {"version": m.group("v"),
                                      "cuda": m.group("cuda") or m.group("cuda2")})]
    out = log_torch.torch_events(payload, meta)
    return out or log_torch.gloo_events(payload, meta)
