"""Metrics no poll fetched: every worker actor appends each step's row to
`<run dir>/logs/attempt-<n>/rank-<r>.metrics.jsonl` (workers/host/actor.py) twice: when the step is
done (without ``loss``: the global mean is known only at the loop's next sync step,
workers/loop/stepsync.py) and at that sync (the full row). When an attempt's controller is lost
(the control plane died with the embedded Ray: SIGKILL of `meshyard serve`), the rows reported
after the last poll exist only there; when a rank dies, the steps done since the last sync
exist only there (without their loss). The poller ingests them before it applies the restart
policy.

Exactly once: `Store.add_missing_metrics` inserts, in one transaction, only the rows past the
newest step the store holds for each (attempt, rank) -- that step is the cursor -- so an
ingest that is repeated (a second control plane, a crash mid-way) adds nothing twice, and
the rows the poller did write are never duplicated.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from orchestrator.isolation import runfiles
from orchestrator.store.repo import Store
from workers.host.assignment import rank_log_path

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


def ingest_attempt_files(store: Store, *, job_id: str, attempt: int, run_dir: Path,
                         world_size: int) -> int:
    """Adds the attempt's rows the store lacks; returns how many."""
    log_dir = run_dir / "logs" / f"attempt-{attempt}"
    rows = []
    for rank in range(world_size):
        rows += read_rank_rows(rank_log_path(str(log_dir), rank, "metrics.jsonl"), rank=rank,
                               run_dir=run_dir)
    added = store.add_missing_metrics(job_id, attempt, rows) if rows else 0
    if added:
        log.warning("job %s attempt %d: %d metric rows recovered from the run dir", job_id,
                    attempt, added)
    return added
