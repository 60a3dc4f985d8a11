"""Metrics no poll fetched: every worker actor appends each step's row to
`<run dir>/logs/attempt-<n>/rank-<r>.metrics.jsonl` (workers/host/actor.py) twice: when the step is
done (without ``loss``: the global mean is known only at the loop's next sync step,
workers/loop/stepsync.py) and at that sync (the full row). When an attempt's controller is lost
(the control plane died with the embedded Ray: SIGKILL of `meshyard serve`), the rows reported
after the last poll exist only there; when a rank dies, the steps done since the last sync
exist only there (without their loss). The poller ingests them before it applies the restart
policy.

The files are on the disk of the host each rank ran on: a rank whose node is alive in Ray is
read there, by a Ray task on that node (`gather_rows`). A rank whose node is gone (a crashed
host, or the embedded Ray that died with the control plane) or was never recorded is read
here, where the embedded single-machine case keeps it; when its file is not here either, or
its node does not answer, `unrecovered` names the rank and the job's events say so.

Exactly once: `Store.add_missing_metrics` inserts, in one transaction, only the rows past the
newest step the store holds for each (attempt, rank) -- that step is the cursor -- so an
ingest that is repeated (a second control plane, a crash mid-way) adds nothing twice, and
the rows the poller did write are never duplicated.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.isolation import runfiles
from workers.host.assignment import rank_log_path

if TYPE_CHECKING:
    from orchestrator.store.repo import Store

log = logging.getLogger("meshyard.poller")
MAX_FILE_BYTES = 256 * 1024 * 1024  # one rank's rows of one attempt; more is not a metrics file


def read_rank_rows(path: Path, *, rank: int, run_dir: Path) -> list[dict[str, Any]]:
    """The complete rows of one rank's file (a torn last line, cut by the kill, is skipped).
    The file is in the job's run dir: read beneath it, never through a link."""
    try:
        if runfiles.size(run_dir, path) > MAX_FILE_BYTES:
            log.warning("%s is over %d bytes: not ingested", path, MAX_FILE_BYTES)
            return []
        text = runfiles.read_bytes(run_dir, path, max_bytes=MAX_FILE_BYTES).decode(
            "utf-8", errors="replace")
    except OSError:
        return []
    rows: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and "time" in row:
            # A step's row before its sync (no loss) and then the full row: one, merged.
            rows.setdefault(row["step"], {}).update(row, rank=rank)
    return list(rows.values())


# A live node's answer; a cut-off one delays the restart this long, unless the attempt's end
# named it unreachable (gather_rows: `unreachable`).
NODE_READ_TIMEOUT_S = 5.0


def read_attempt_rows(run_dir: str | Path, attempt: int, ranks: list[int]
                      ) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of `ranks`' files of one attempt, read on this host, and the ranks whose
    file is not here."""
    run = Path(run_dir)
    log_dir = run / "logs" / f"attempt-{attempt}"
    rows: list[dict[str, Any]] = []
    missing = []
    for rank in ranks:
        path = rank_log_path(str(log_dir), rank, "metrics.jsonl")
        try:
            there = runfiles.is_file(run, path)
        except OSError:
            there = False
        if not there:
            missing.append(rank)
            continue
        rows += read_rank_rows(path, rank=rank, run_dir=run)
    return rows, missing


@dataclass
class Gathered:
    rows: list[dict[str, Any]] = field(default_factory=list)
    unrecovered: dict[int, str] = field(default_factory=dict)  # rank -> why
    added: int = 0  # rows the store did not hold yet


def gather_rows(*, run_dir: Path, attempt: int, world_size: int,
                nodes: Mapping[int, str | None],
                unreachable: Collection[str] = ()) -> Gathered:
    """Every rank's rows, each read on its node (`nodes`: rank -> Ray node id) by a Ray task
    pinned there; ranks with no node are read here. The nodes in `unreachable` (cut off from
    the attempt's controller when it ended) are not asked: their ranks are named."""
    import ray

    from orchestrator.runtime.on_nodes import run_on_nodes

    alive = ({n["NodeID"] for n in ray.nodes() if n.get("Alive")}
             if ray.is_initialized() else set())
    by_node: dict[str, list[int]] = {}
    here: list[int] = []
    out = Gathered()
    for rank in range(world_size):
        node = nodes.get(rank)
        if node is not None and node in unreachable:
            out.unrecovered[rank] = "its host was cut off from the controller"
            continue
        (by_node.setdefault(node, []) if node in alive else here).append(rank)
    out.rows, missing = read_attempt_rows(run_dir, attempt, here)
    for rank in missing:
        if nodes.get(rank):  # it ran somewhere else, now gone
            out.unrecovered[rank] = "its node is gone"
    got = run_on_nodes(read_attempt_rows, {
        node: {"run_dir": str(run_dir), "attempt": attempt, "ranks": ranks}
        for node, ranks in by_node.items()}, timeout_s=NODE_READ_TIMEOUT_S)
    for node, found in got.items():
        if isinstance(found, Exception):  # a cut-off node: its ranks are named
            for rank in by_node[node]:
                out.unrecovered[rank] = f"its node did not answer ({type(found).__name__})"
        else:
            out.rows += found[0]
    return out


def ingest_attempt_files(store: Store, *, job_id: str, attempt: int, run_dir: Path,
                         world_size: int, nodes: Mapping[int, str | None] | None = None,
                         unreachable: Collection[str] = ()) -> Gathered:
    """Adds the attempt's rows the store lacks (read on each rank's node, `gather_rows`);
    returns what was read and which ranks could not be."""
    got = gather_rows(run_dir=run_dir, attempt=attempt, world_size=world_size,
                      nodes=nodes or {}, unreachable=unreachable)
    got.added = store.add_missing_metrics(job_id, attempt, got.rows) if got.rows else 0
    if got.added:
        log.warning("job %s attempt %d: %d metric rows recovered from the ranks' files",
                    job_id, attempt, got.added)
    return got
