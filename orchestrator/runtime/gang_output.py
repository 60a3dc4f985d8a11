"""What one attempt's ranks said: a `Drained` batch per controller tick (metrics, log lines,
per-rank updates, utilisation samples, checkpoints, collective counts), the last lines of each
rank's output (the anchor from which a dead rank's unread output is found on its node), and
utilisation samples thinned to a bounded rate for the whole job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestrator.lifecycle import LogStream
from orchestrator.runtime.events import AttemptConfig, RankStatus
from orchestrator.runtime.on_nodes import start_on_nodes
from workers.host.assignment import RankResult, rank_log_path
from workers.host.logcapture import unseen_tail

_ANCHOR_LINES = 3
_CAPTURED = (LogStream.STDOUT, LogStream.STDERR)
# How long a dead rank's log read on its node is waited for, from its start.
READ_TIMEOUT_S = 30.0


def unseen_tails(reads: list[tuple[int, LogStream, str, list[str]]], beneath: str
                 ) -> list[tuple[int, LogStream, list[str]]]:
    """Runs on a node: for each (rank, stream, path, anchor), the lines of the rank's log
    file there after `anchor` (see `unseen_tail`)."""
    return [(r, stream, unseen_tail(path, anchor, beneath=beneath))
            for r, stream, path, anchor in reads]


@dataclass(frozen=True)
class _TailRead:
    """One node's read of its dead ranks' log tails, under way."""

    ref: Any
    node_id: str
    started: float  # monotonic
    ranks: list[int]


@dataclass(frozen=True)
class Drained:
    """One tick's poll of every live worker: metrics rows, log lines, per-rank updates
    (RankStatus fields: state, step, start_step, phase, last_heartbeat, pid), utilisation
    samples (at most one per rank per `usage_interval_s`), rank 0's completed checkpoints, and
    per rank of a user-code job the count of collectives its probe last saw enqueued (its
    progress when it reports no step)."""

    metrics: tuple[dict[str, Any], ...] = ()
    logs: tuple[dict[str, Any], ...] = ()
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: tuple[dict[str, Any], ...] = ()
    checkpoints: tuple[dict[str, Any], ...] = ()
    collectives: dict[int, int] = field(default_factory=dict)
    # ranks that answered again after a silence the others did not share (answer_gaps.py):
    # rank, node, host, silent_s
    gaps: tuple[dict[str, Any], ...] = ()


class RankOutputs:
    def __init__(self, cfg: AttemptConfig) -> None:
        self.cfg = cfg
        self._last_lines: dict[tuple[int, str], list[str]] = {}  # (rank, stream) -> anchor
        self._untailed: set[int] = set()  # dead ranks whose last output is not read yet
        self._reads: list[_TailRead] = []  # their reads under way
        self._usage_at: dict[int, float] = {}  # rank -> time of its last kept sample
        # At most ~5 utilisation rows per second for the whole job, whatever its size.
        self._usage_every_s = max(cfg.usage_interval_s, cfg.world_size / 5.0)

    def died(self, rank: int) -> None:
        """Its process is gone: what it wrote after its last forwarded line is read once."""
        self._untailed.add(rank)

    def keep_usage(self, rank: int, at: float) -> bool:
        if at - self._usage_at.get(rank, 0.0) < self._usage_every_s:
            return False
        self._usage_at[rank] = at
        return True

    def remember_lines(self, logs: list[dict[str, Any]]) -> None:
        for line in logs:
            key = (int(line.get("rank", -1)), str(line.get("stream")))
            if key[1] in _CAPTURED:
                kept = self._last_lines.setdefault(key, [])
                kept.append(str(line.get("line", "")))
                del kept[:-_ANCHOR_LINES]

    def dead_ranks_output(self, ranks: Mapping[int, RankStatus],
                          results: Mapping[int, RankResult], *,
                          unreachable: set[int] | frozenset[int] = frozenset(),
                          final: bool = False) -> list[dict[str, Any]]:
        """What dead ranks wrote after their last forwarded line (lost with their process's
        buffers), read from their log files on their node: one read per node, started the
        tick a death is seen and collected on a later tick once it answers (a Ray task on a
        loaded host may take many seconds to start). `final`: the attempt's last drain waits
        for the reads still out, up to READ_TIMEOUT_S from their start; a read that gets no
        answer by then yields a line saying where the rank's full output is. The ranks in
        `unreachable` (their host answers nothing) are not asked."""
        by_node: dict[str, list[tuple[int, LogStream, str, list[str]]]] = {}
        for r in sorted(self._untailed):
            self._untailed.discard(r)
            if r in unreachable or not ranks[r].node_id:
                continue
            by_node.setdefault(str(ranks[r].node_id), []).extend(
                (r, stream, str(rank_log_path(self.cfg.log_dir, r, stream)),
                 self._last_lines.get((r, stream), [])) for stream in _CAPTURED)
        if by_node:
            started = time.monotonic()
            for nid, ref in start_on_nodes(unseen_tails, {
                    nid: {"reads": reads, "beneath": self.cfg.run_dir}
                    for nid, reads in by_node.items()}).items():
                self._reads.append(_TailRead(ref=ref, node_id=nid, started=started,
                                             ranks=sorted({r for r, *_ in by_node[nid]})))
        if not self._reads:
            return []
        wait_s = 0.0
        if final:
            wait_s = max(0.0, max(x.started for x in self._reads) + READ_TIMEOUT_S
                         - time.monotonic())
        ready = set(ray.wait([x.ref for x in self._reads], num_returns=len(self._reads),
                             timeout=wait_s)[0])
        out: list[dict[str, Any]] = []
        pending: list[_TailRead] = []
        for read in self._reads:
            if read.ref in ready:
                out.extend(self._lines_read(read, results))
            elif final or time.monotonic() - read.started >= READ_TIMEOUT_S:
                ray.cancel(read.ref, force=True)
                out.extend(self._not_read(read, ranks, results))
            else:
                pending.append(read)
        self._reads = pending
        return out

    @staticmethod
    def _lines_read(read: _TailRead, results: Mapping[int, RankResult]
                    ) -> list[dict[str, Any]]:
        try:
            found = ray.get(read.ref, timeout=0)
        except Exception:  # noqa: BLE001 - its host is gone or cut off: nothing more is known
            return []
        out: list[dict[str, Any]] = []
        for r, stream, lines in found:
            died = results[r].time or time.time()
            out.extend({"rank": r, "stream": stream, "line": x, "time": died} for x in lines)
        return out

    def _not_read(self, read: _TailRead, ranks: Mapping[int, RankStatus],
                  results: Mapping[int, RankResult]) -> list[dict[str, Any]]:
        return [{"rank": r, "stream": LogStream.LOG, "time": results[r].time or time.time(),
                 "line": f"WARNING the last lines rank {r} wrote could not be read from its "
                 f"node within {READ_TIMEOUT_S:g} s; its whole output is in "
                 f"{rank_log_path(self.cfg.log_dir, r, LogStream.STDOUT)} and "
                 f"{rank_log_path(self.cfg.log_dir, r, LogStream.STDERR)} on "
                 f"{ranks[r].node or read.node_id}"} for r in read.ranks]
