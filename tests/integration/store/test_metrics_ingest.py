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
            rows = [json.dumps({"rank": r, "step": s, "time": float(s), "loss": 1.0 / s,
                                "grad_comm_bytes": 1000 * s, "moe_aux_loss": 1.0 + s / 100})
                    for s in range(1, 6)]
            (logs / f"rank-{r}.metrics.jsonl").write_text("\n".join(rows) + '\n{"step": 6, "ti')
        run = tmp_path / job.id
        assert ingest_attempt_files(store, job_id=job.id, attempt=1, run_dir=run,
                                    world_size=2).added == 6  # steps 3-5 of both; torn line out
        assert ingest_attempt_files(store, job_id=job.id, attempt=1, run_dir=run,
                                    world_size=2).added == 0
        for r in (0, 1):
            got = store.list_metrics(job.id, rank=r)
            assert [m.step for m in got] == [1, 2, 3, 4, 5]
            # The recovered rows keep every metric the store has a column for.
            assert [(m.grad_comm_bytes, m.moe_aux_loss) for m in got[2:]] == [
                (1000 * s, 1.0 + s / 100) for s in (3, 4, 5)]
        got = store.get_job(job.id)
        assert got is not None and got.last_step == 5 and got.last_loss == pytest.approx(0.2)
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_a_step_done_before_its_sync_is_recovered_and_merged_with_its_full_row(
        db_url: str, tmp_path: Path) -> None:
    """The worker writes each step's row when the step is done (no loss yet) and again at the
    loop's sync step (with the global loss); a rank that died in between left only the first."""
    store = open_store(db_url)
    try:
        job, _ = store.submit_job(parse_spec({"name": "pending"}), owner="admin")
        logs = tmp_path / job.id / "logs" / "attempt-1"
        logs.mkdir(parents=True)
        lines = [{"step": s, "time": float(s), "grad_norm": 1.0} for s in (1, 2, 3)]
        lines += [{"step": s, "time": float(s), "grad_norm": 1.0, "loss": 1.0 / s}
                  for s in (1, 2)]
        (logs / "rank-0.metrics.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines))
        assert ingest_attempt_files(store, job_id=job.id, attempt=1,
                                    run_dir=tmp_path / job.id, world_size=1).added == 3
        got = [(m.step, m.loss, m.grad_norm) for m in store.list_metrics(job.id, rank=0)]
        assert got == [(1, 1.0, 1.0), (2, 0.5, 1.0), (3, None, 1.0)]
        job_now = store.get_job(job.id)
        assert job_now is not None and job_now.last_step == 3
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_a_rank_on_a_host_cut_off_from_the_controller_is_named_not_read(
        db_url: str, tmp_path: Path) -> None:
    """The attempt ended with rank 1's host cut off: its file is not asked for (the read would
    wait out its timeout before the restart); rank 0's rows are recovered."""
    store = open_store(db_url)
    try:
        job, _ = store.submit_job(parse_spec({"name": "cut-off",
                                              "parallelism": {"dp_replicate": 2}}),
                                  owner="admin")
        logs = tmp_path / job.id / "logs" / "attempt-1"
        logs.mkdir(parents=True)
        for r in (0, 1):
            (logs / f"rank-{r}.metrics.jsonl").write_text("".join(
                json.dumps({"rank": r, "step": s, "time": float(s), "loss": 1.0}) + "\n"
                for s in (1, 2, 3)))
        got = ingest_attempt_files(store, job_id=job.id, attempt=1, run_dir=tmp_path / job.id,
                                   world_size=2, nodes={0: "node-a", 1: "node-b"},
                                   unreachable=("node-b",))
        assert got.added == 3
        assert got.unrecovered == {1: "its host was cut off from the controller"}
        assert [m.step for m in store.list_metrics(job.id, rank=0)] == [1, 2, 3]
        assert store.list_metrics(job.id, rank=1) == []
    finally:
        store.close()
