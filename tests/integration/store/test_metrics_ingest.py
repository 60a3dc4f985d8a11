"""Rows recovered from a lost attempt's metrics files go in exactly once (SQLite, PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.runtime.metrics_files import ingest_attempt_files
from orchestrator.spec import parse_spec
from orchestrator.store import open_store


@pytest.mark.timeout(60)
def test_ingest_adds_only_what_the_store_lacks_and_only_once(db_url: str, tmp_path: Path
                                                              ) -> None:
    store = open_store(db_url)
    try:
        job, _ = store.submit_job(parse_spec({"name": "ingest",
                                              "parallelism": {"dp_replicate": 2}}),
                                  owner="admin")
        store.add_metrics(job.id, 1, [{"rank": r, "step": s, "time": float(s), "loss": 1.0}
                                      for r in (0, 1) for s in (1, 2)])
        logs = tmp_path / job.id / "logs" / "attempt-1"
        logs.mkdir(parents=True)
        for r in (0, 1):
            rows = [json.dumps({"rank": r, "step": s, "time": float(s), "loss": 1.0 / s})
                    for s in range(1, 6)]
            (logs / f"rank-{r}.metrics.jsonl").write_text("\n".join(rows) + '\n{"step": 6, "ti')
        run = tmp_path / job.id
        assert ingest_attempt_files(store, job_id=job.id, attempt=1, run_dir=run,
                                    world_size=2) == 6  # steps 3-5 of both ranks; torn line out
        assert ingest_attempt_files(store, job_id=job.id, attempt=1, run_dir=run,
                                    world_size=2) == 0
        for r in (0, 1):
            assert [m.step for m in store.list_metrics(job.id, rank=r)] == [1, 2, 3, 4, 5]
        got = store.get_job(job.id)
        assert got is not None and got.last_step == 5 and got.last_loss == pytest.approx(0.2)
    finally:
        store.close()
