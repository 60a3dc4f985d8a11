"""Warm pool: pre-started worker actors are reused by the next job, carry nothing over from
the previous one, and are replaced (not reused) after a failed job. CPU jobs go to the
CPU-only node c1 of the shared cluster, where the pool keeps its actors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.lifecycle import JobState
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state


@pytest.fixture()
def runtime(settings, store) -> Iterator[Any]:
    from orchestrator.runtime.service import Runtime

    rt = Runtime(settings, store, tick_s=0.2, warm_pool=2)
    rt.start()
    try:
        rt.wait_for_pool(timeout_s=120)
        yield rt
    finally:
        rt.stop()


def _spec(name: str, **over: Any) -> dict[str, Any]:
    model = {"kind": "import", "path": "tests.integration.runtime.pool_model:build",
             "kwargs": over.pop("kwargs", {}), "vocab_size": 64, "seq_len": 16}
    return tiny_spec(name, model=model, resources={"device": "cpu", "cpus_per_worker": 0.5},
                     training={"steps": 2}, checkpoint={"enabled": False}, **over)


def _pids(store, job_id: str) -> set[int]:
    return {r.pid for r in store.list_ranks(job_id)}


@pytest.mark.slow
def test_pooled_workers_are_reused_isolated_and_replaced_after_failure(runtime, store):
    first = submit(store, _spec("pollutes"))
    assert wait_state(store, first, JobState.SUCCEEDED, JobState.FAILED).state == \
        JobState.SUCCEEDED
    # The second job's model raises if the first job's env var or module state survived.
    second = submit(store, _spec("expects-clean", kwargs={"expect_clean": True}))
    job = wait_state(store, second, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.SUCCEEDED, job.message
    assert _pids(store, second) == _pids(store, first)  # same warm processes, reused

    crashed = submit(store, _spec("crashes", fault_tolerance={"max_failures": 0},
                                  inject_fault={"kind": "crash", "rank": 0, "step": 1}))
    assert wait_state(store, crashed, JobState.FAILED, JobState.SUCCEEDED).state == \
        JobState.FAILED
    runtime.wait_for_pool(timeout_s=120)  # refilled
    after = submit(store, _spec("after-crash", kwargs={"expect_clean": True}))
    job = wait_state(store, after, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.SUCCEEDED, job.message
    # the failed job's processes were not reused
    assert not (_pids(store, after) & _pids(store, crashed))
