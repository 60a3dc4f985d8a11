"""Multi-line reports in logs, assembled line by line (see `logs`). Pure module.

- PyTorch desync debug report (TORCH_NCCL_DESYNC_DEBUG=1, TraceUtils retrieveDesyncReport):
  "- [0] Timeout at collective: ALLREDUCE, #315", "... ranks that caused the desync are:",
  "[7] finished collective #182, but didn't join collective #183", a snapshot of states.
- NCCL RAS MISMATCH report (NCCL >= 2.24): operation counts per group of ranks and the ranks
  RAS lists (it lists the minority, which are the ranks AHEAD, not the stragglers).
- Flight Recorder analyzer output ("Not all ranks joining collective ...", "missing ranks: {1}").
- torchrun's failure summary (`ChildFailedError`), read by `log_elastic.FailureSummary`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.watchdog.log_elastic import FailureSummary

Fields = dict[str, Any]
Events = list[tuple[str, Fields]]

_DESYNC_START = re.compile(r"\[(?P<rank>\d+)\] Timeout at collective: (?P<op>\w+), #(?P<seq>\d+)")
_DESYNC_CULPRITS = re.compile(r"ranks that caused the desync are")
_DESYNC_RANKS = re.compile(r"^-?\s*\[(?P<ranks>[\d, ]+)\] (?P<text>.+)$")
_DESYNC_SNAPSHOT = re.compile(r"Snapshot of ranks' latest states")
_DESYNC_STATE = re.compile(r"^#(?P<seq>\d+) (?P<what>\w+) ranks:")

_RAS_START = re.compile(r"#(?P<g>\d+)-(?P<c>\d+) \((?P<hash>[0-9a-f]+)\) MISMATCH")
_RAS_OP = re.compile(r"have different (?P<op>\w+) operation counts")
_RAS_COUNT = re.compile(r"(?<!\d)(?P<n>\d+) ranks? (?:has|have) launched up to operation "
                        r"(?P<c>\d+)")
_RAS_RANK = re.compile(r"(?<!\w)Rank (?P<r>\d+) -- GPU (?P<g>\d+) managed by process (?P<p>\d+) "
                       r"on node (?P<node>\S+)")

_FR_START = re.compile(r"Not all ranks joining collective(?: (?P<old>\d+)(?: at entry (?P<e>\d+))?|"
                       r",? sequence number: (?P<seq>\d+))")
_FR_FIELD = re.compile(r"^(?P<k>group info|collective|missing ranks|input sizes|output sizes|"
                       r"expected ranks|collective state|internal record id): (?P<v>.*)$")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()


class BlockParsers:
    """Feed stripped payloads; get events when a block ends. `consumed` tells the caller the
    last payload belonged to a block and needs no single-line matching."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.data: Fields = {}
        self.mode = ""
        self.consumed = False
        self.failures = FailureSummary()

    def feed(self, payload: str, meta: Mapping[str, Any]) -> Events:
        used, out = self.failures.feed(payload)
        if used:
            self.consumed = True
            return out
        text = payload.strip()
        if self.kind and not self._continue(text):
            out += self._flush_block()
        self.consumed = bool(self.kind)
        if not self.kind:
            self._start(text, meta)
            self.consumed = bool(self.kind)
        return out

    def _start(self, text: str, meta: Mapping[str, Any]) -> None:
        if m := _DESYNC_START.search(text):
            self.kind, self.mode = "desync_report", ""
            self.data = {"rank": int(m.group("rank")), "timeout_op": m.group("op"),
                         "timeout_seq": int(m.group("seq")), "culprit_ranks": [],
                         "culprit_details": [], "snapshot": {}}
        elif m := _RAS_START.search(text):
            self.kind = "ras_mismatch"
            self.data = {"comm_hash": m.group("hash"), "op": None, "counts": [], "listed": []}
        elif m := _FR_START.search(text):
            self.kind, self.mode = "fr_missing_ranks", ""
            seq = m.group("seq") or m.group("old")
            self.data = {"seq": int(seq), "entry": int(m.group("e")) if m.group("e") else None,
                         "stack": []}

    def _continue(self, text: str) -> bool:
        if self.kind == "desync_report":
            return self._desync(text)
        if self.kind == "ras_mismatch":
            return self._ras(text)
        if self.kind == "fr_missing_ranks":
            return self._fr(text)
        return False

    def _desync(self, text: str) -> bool:
        if _DESYNC_CULPRITS.search(text):
            self.mode = "culprits"
            return True
        if _DESYNC_SNAPSHOT.search(text):
            self.mode = "snapshot"
            return True
        if m := _DESYNC_STATE.match(text.lstrip("- ")):
            self.mode = f"snapshot:#{m.group('seq')} {m.group('what')}"
            self.data["snapshot"].setdefault(self.mode.split(":", 1)[1], [])
            return True
        m = _DESYNC_RANKS.match(text)
        if m and self.mode:
            ranks = [int(x) for x in m.group("ranks").split(",") if x.strip()]
            if self.mode == "culprits":
                self.data["culprit_ranks"] += ranks
                self.data["culprit_details"].append(m.group("text").strip())
            elif self.mode.startswith("snapshot:"):
                key = self.mode.split(":", 1)[1]
                self.data["snapshot"][key].append({"ranks": ranks, "state": m.group("text")})
            return True
        return False

    def _ras(self, text: str) -> bool:
        if m := _RAS_OP.search(text):
            self.data["op"] = m.group("op")
        elif m := _RAS_COUNT.search(text):
            self.data["counts"].append({"ranks": int(m.group("n")), "op_count": int(m.group("c"))})
        elif m := _RAS_RANK.search(text):
            self.data["listed"].append({"rank": int(m.group("r")), "gpu": int(m.group("g")),
                                        "pid": int(m.group("p")), "node": m.group("node")})
        else:
            return False
        return True

    def _fr(self, text: str) -> bool:
        if m := _FR_FIELD.match(text):
            key = m.group("k").replace(" ", "_")
            val = _literal(m.group("v"))
            if key == "missing_ranks" and isinstance(val, set | list | tuple):
                val = sorted(int(x) for x in val)
            self.data[key] = val
            return True
        if text == "collective stack trace:":
            self.mode = "stack"
            return True
        if self.mode == "stack" and text and " at " in text and not _FR_START.search(text):
            self.data["stack"].append(text)
            return True
        return False

    def flush(self) -> Events:
        return self.failures.flush() + self._flush_block()

    def _flush_block(self) -> Events:
        if not self.kind:
            return []
        kind, data = self.kind, dict(self.data)
        self.kind, self.data, self.mode = None, {}, ""
        if kind == "ras_mismatch":
            data["listed_ranks"] = [x["rank"] for x in data["listed"]]
            counts = [c["op_count"] for c in data["counts"]]
            data["max_op_count"] = max(counts) if counts else None
            data["min_op_count"] = min(counts) if counts else None
        return [(kind, data)]
