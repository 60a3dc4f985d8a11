"""What launchers and log shippers put before a log record: strip it, keep what it says.

Pure module (stdlib only). Prefixes chain in any order ("[pod/w-0/c] 2024-05-01T10:00:00Z
0: [rank3]:..."); `strip_decorations` removes known ones from the front one after another and
returns the payload (its own indentation kept: multi-line reports are read by it) and the
facts they carried:

- a log viewer's "[80746] " (column 0 only), Ray's "(RayTrainWorker pid=1, ip=...)" and its
  "[repeated 14x across cluster]" suffix;
- ranks: mpirun's "[1,3]<stdout>:", torchrun's "[rank3]:" / "[default3]:", "[name|3]:",
  Slurm `srun --label`'s "3: " (padded " 3: " in wide jobs);
- timestamps: RFC 3339 / ISO 8601 (Kubernetes `--timestamps`, Loki, Python logging with a
  comma, bracketed "[2024-05-01 10:00:00,123]" and NCCL's own "[%F %T] "), mpirun
  `--timestamp-output`'s ctime ("Thu May  7 10:39:20 2020"), syslog / journald
  ("May  7 10:39:20 host prog[12]: "), glog's "I0501 10:00:00.123456 123 file.cc:1]" is not a
  prefix (PyTorch's own lines carry it and the patterns read it);
- Kubernetes `kubectl logs --prefix`'s "[pod/NAME/CONTAINER] " and logcli's `{k="v", ...} `.

Text before a record that none of these describe is left in the payload: the patterns find
an NCCL line's own structure wherever it starts (`rank_in_prefix` reads a rank from it).
"""

from __future__ import annotations

import re
from typing import Any

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_VIEWER_RE = re.compile(r"^\[(\d+)\] (?=\S)")
_RAY_RE = re.compile(r"^\((?:(?P<actor>[\w.\-]+) )?pid=(?P<pid>\d+)"
                     r"(?:, ip=(?P<ip>[0-9a-fA-F.:]+))?(?:, [^()\n]*)?\) ?")
_MPI_RE = re.compile(r"^\[(?P<job>\d+),(?P<rank>\d+)\]<(?:stdout|stderr)>:")
_TORCHRUN_RE = re.compile(r"^\[(?:rank|default)(?P<rank>\d+)\]:\s?")
_NAMED_RE = re.compile(r"^\[(?P<name>[\w.\-]+)\|(?P<rank>\d+)\]:\s?")
_SLURM_RE = re.compile(r"^(?P<rank>\d{1,6}): ")
_KUBECTL_RE = re.compile(r"^\[pod/[\w.\-]+/[\w.\-]+\] ")
_LOKI_RE = re.compile(r'^\{[\w.\-]+="[^"\n]*"(?:, ?[\w.\-]+="[^"\n]*")*\} ')
_ISO_TS_RE = re.compile(
    r"^\[?\d{4}-\d{2}-\d{2}[ T_]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?: ?(?:Z|[+-]\d{2}:?\d{2}|UTC))?"
    r"\]?(?: ?[|:-](?=\s))?[ \t]?")
_CTIME_RE = re.compile(rf"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MONTH} [ \d]\d \d{{2}}:\d{{2}}:"
                       rf"\d{{2}} \d{{4}} ?")
_SYSLOG_RE = re.compile(rf"^{_MONTH} [ \d]\d \d{{2}}:\d{{2}}:\d{{2}} [\w.\-]+ [\w.\-/]+"
                        rf"(?:\[\d+\])?: ")
_REPEAT_RE = re.compile(r"\[repeated (\d+)x across cluster\]\s*$")
# Rank-bearing forms inside text the patterns did not recognise as a prefix.
_RANK_IN_TEXT_RE = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>|\[(?:rank|default)(\d+)\]:"
                              r"|\[[\w.\-]+\|(\d+)\]:|(?:^|\s)(\d{1,6}):(?:\s|$)")

_RANKED = (_MPI_RE, _TORCHRUN_RE, _SLURM_RE)
_PLAIN = (_KUBECTL_RE, _LOKI_RE, _ISO_TS_RE, _CTIME_RE, _SYSLOG_RE)
MAX_PREFIXES = 12


def _one(s: str, meta: dict[str, Any]) -> int:
    """Length of one known prefix at the start of `s` (0: none), recording what it says."""
    if m := _RAY_RE.match(s):
        if m.group("actor"):
            meta["actor"] = m.group("actor")
        meta["actor_pid"] = int(m.group("pid"))
        if m.group("ip"):
            meta["ip"] = m.group("ip")
        return m.end()
    for rx in _RANKED:
        if m := rx.match(s):
            meta["launcher_rank"] = int(m.group("rank"))
            return m.end()
    if m := _NAMED_RE.match(s):
        meta.update(launcher_rank=int(m.group("rank")), launcher_name=m.group("name"))
        return m.end()
    for rx in _PLAIN:
        if m := rx.match(s):
            return m.end()
    return 0


def strip_decorations(line: str) -> tuple[str, dict[str, Any]]:
    """`line` (no ANSI codes left) -> (payload, facts the prefixes carried).

    >>> strip_decorations("2024-05-01T10:00:00.5Z 3: [1,3]<stdout>:host:1:2 [0] NCCL INFO x")
    ('host:1:2 [0] NCCL INFO x', {'launcher_rank': 3})
    """
    meta: dict[str, Any] = {}
    s = line.rstrip("\r\n")
    if m := _REPEAT_RE.search(s):
        meta["repeated"] = int(m.group(1))
        s = s[: m.start()].rstrip()
    if m := _VIEWER_RE.match(s):  # only at column 0: indented "[7] finished ..." is a report
        s = s[m.end():]
    for _ in range(MAX_PREFIXES):
        t = s.lstrip()
        n = _one(t, meta)
        if not n:
            break
        s = t[n:]
    return s, meta


def rank_in_prefix(text: str) -> int | None:
    """The last rank a launcher wrote in `text`, the part of a line before an NCCL record
    that no known prefix described (a chain of log shippers around one): 'x [1,5]<stdout>: y'
    -> 5."""
    found = None
    for m in _RANK_IN_TEXT_RE.finditer(text):
        found = next(int(g) for g in m.groups() if g is not None)
    return found
