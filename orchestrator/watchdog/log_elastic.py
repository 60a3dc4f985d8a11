"""torchrun's failure summary (`ChildFailedError`) -> one `rank_exited` event per failure.
Pure module (stdlib only). torch.distributed.elastic prints, when a worker process exits::

    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2024-05-19_16:39:58
      host      : node-1
      rank      : 5 (local_rank: 1)
      exitcode  : -6 (pid: 78971)
      error_file: <N/A>
      traceback : Signal 6 (SIGABRT) received by PID 78971
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : ...
      error_file: /tmp/torchelastic_x/none_y/attempt_0/4/error.json
      traceback : Traceback (most recent call last):
        File "train.py", line 9, in <module>
      ...
      RuntimeError: CUDA error: an illegal memory access was encountered
    ============================================================

`[N]` is an index, `rank` the global rank. An event carries rank, local_rank, host, time (as
printed, the agent's local clock), exit_code, pid, signal, error_file (None for <N/A>),
traceback (None when torchrun only points at its docs), exception (the traceback's last line,
or the signal message) and `root_cause` (the entry under "Root Cause"). An entry cut before its
`traceback :` field is `partial: True`. Lines keep their indentation after prefixes are
stripped: a traceback continues while lines are indented.
"""

from __future__ import annotations

import re
from typing import Any

Fields = dict[str, Any]
Events = list[tuple[str, Fields]]

_START_RE = re.compile(r"ChildFailedError|^Failures:$|^Root Cause \(first observed failure\):$")
_DELIM_RE = re.compile(r"^(?P<c>[=\-])(?P=c){9,}$")
_TITLE_RE = re.compile(r"^\S.* FAILED$")
_ENTRY_RE = re.compile(r"^\[(?P<idx>\d+)\]:$")
_FIELD_RE = re.compile(r"^\s{0,4}(?P<k>time|host|rank|exitcode|error_file|traceback)\s*: ?"
                       r"(?P<v>.*)$")
_RANK_RE = re.compile(r"^(?P<r>\d+)(?: \(local_rank: (?P<lr>\d+)\))?")
_EXIT_RE = re.compile(r"^(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?(?:\s*\((?P<sig>SIG\w+)\))?")
_SIGNAL_RE = re.compile(r"^Signal \d+ \((?P<sig>SIG\w+)\) received by PID \d+")
_EXC_RE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Warning)"
                     r"(?::.*)?$|^[A-Za-z_][\w.]*: .+$")
_NO_TRACEBACK = "To enable traceback see"


class FailureSummary:
    """Line-by-line reader of the summary. `feed(payload)` says whether the line belonged to
    it and returns the events of entries it closed."""

    def __init__(self) -> None:
        self.active = False
        self.section = ""
        self.entry: Fields | None = None
        self.tb: list[str] | None = None

    def feed(self, payload: str) -> tuple[bool, Events]:
        text = payload.strip()
        if not self.active:
            if _START_RE.search(text):
                self.active, self.section = True, ""
                self._section(text)
                return True, []
            return False, []
        if self.tb is not None and payload[:1].isspace() and not _FIELD_RE.match(payload):
            self.tb.append(payload.rstrip())
            return True, []
        return self._structure(payload, text)

    def _section(self, text: str) -> None:
        if text == "Failures:":
            self.section = "failures"
        elif text.startswith("Root Cause"):
            self.section = "root"

    def _structure(self, payload: str, text: str) -> tuple[bool, Events]:
        if m := _DELIM_RE.match(text):
            out = self._close()
            if m.group("c") == "=" and self.section == "root":
                self.active = False
            return True, out
        if text in ("Failures:", "Root Cause (first observed failure):"):
            out = self._close()
            self._section(text)
            return True, out
        if _TITLE_RE.match(text) or text == "<NO_OTHER_FAILURES>" or not text:
            return True, []
        if m := _ENTRY_RE.match(text):
            out = self._close()
            self.entry = {"index": int(m.group("idx"))}
            return True, out
        if self.entry is not None and (f := _FIELD_RE.match(payload)):
            self._field(f.group("k"), f.group("v").strip())
            return True, []
        out = self.flush()
        return False, out

    def _field(self, key: str, value: str) -> None:
        e = self.entry
        assert e is not None
        if key == "rank" and (m := _RANK_RE.match(value)):
            e["rank"] = int(m.group("r"))
            e["local_rank"] = int(m.group("lr")) if m.group("lr") else None
        elif key == "exitcode" and (m := _EXIT_RE.match(value)):
            e["exit_code"] = int(m.group("code"))
            e["pid"] = int(m.group("pid")) if m.group("pid") else None
            e["signal"] = m.group("sig")
        elif key == "error_file":
            e["error_file"] = None if value in ("<N/A>", "") else value
        elif key == "traceback":
            self.tb = [value]
        elif key in ("time", "host"):
            e[key] = value or None

    def _close(self) -> Events:
        e, tb = self.entry, self.tb
        self.entry, self.tb = None, None
        if e is None:
            return []
        out: Fields = {"rank": e.get("rank"), "local_rank": e.get("local_rank"),
                       "host": e.get("host"), "time": e.get("time"),
                       "exit_code": e.get("exit_code"), "pid": e.get("pid"),
                       "signal": e.get("signal"), "error_file": e.get("error_file"),
                       "traceback": None, "exception": None,
                       "root_cause": self.section == "root"}
        if tb is not None:
            _traceback(out, tb)
        else:
            out["partial"] = True
        return [("rank_exited", out)]

    def flush(self) -> Events:
        out = self._close()
        self.active, self.section = False, ""
        return out


def _traceback(out: Fields, lines: list[str]) -> None:
    """The traceback field: torchrun indents the error file's call stack by two spaces."""
    body = [ln[2:] if ln.startswith("  ") else ln for ln in lines[1:]]
    first = lines[0].strip()
    if first.startswith(_NO_TRACEBACK):
        return
    text = "\n".join([first, *body]).strip()
    out["traceback"] = text or None
    if m := _SIGNAL_RE.match(first):
        out["exception"] = first
        out["signal"] = out["signal"] or m.group("sig")
        return
    tail = [ln.strip() for ln in body if ln.strip()]
    candidates = [ln for ln in tail if not ln.startswith(("File ", "^", "~"))]
    if candidates and _EXC_RE.match(candidates[-1]):
        out["exception"] = candidates[-1]
    elif first and not first.startswith("Traceback"):
        out["exception"] = first
