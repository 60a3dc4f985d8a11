"""What a running job reports besides its loss, through the whole runtime on the simulated
cluster: every rank's stacks on demand ("stacks now", the watchdog's diagnostics path), the
built-in loop's learning rate and grad norm, complete checkpoints with their size, and
utilisation per rank and per node (CPU and memory here; the fake GPUs have no NVML)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.settings import Settings
from orchestrator.store.repo import Store
from tests.integration.runtime.conftest import (
    submit,
    tiny_spec,
    wait_for,
    wait_state,
    write_cluster_file,
)

pytestmark = [pytest.mark.slow]


def until(what: str, fn: Callable[[], Any], *, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"never: {what}")


def test_stacks_now_lr_checkpoints_and_usage(ray_connected, store: Store, tmp_path) -> None:
    from orchestrator.runtime.service import Runtime

    settings = Settings(data_dir=tmp_path, ray_address=ray_connected.address,
                        cluster_file=write_cluster_file(tmp_path / "cluster.yaml"),
                        allow_fault_injection=True, usage_interval_s=1,
                        node_usage_interval_s=1)
    rt = Runtime(settings, store, tick_s=0.2)
    rt.start()
    try:
        job_id = submit(store, tiny_spec(
            "insight", training={"steps": 24, "lr": 0.02},
            checkpoint={"enabled": True, "every_steps": 6, "keep": 2, "async_save": False},
            # rank 1 sleeps at the start of every step: the job stays up for stacks, and
            # its training thread is somewhere else than rank 0's
            inject_fault={"kind": "slow", "rank": 1, "step": 1, "seconds": 0.3}))
        job = wait_for(store, job_id, lambda j: (j.last_step or 0) >= 2, what="step 2")
        request = store.request_stacks(job_id, attempt=job.current_attempt,
                                       requested_by="admin")
        done = until("stacks collected", lambda: (
            r := store.get_stack_request(job_id, request.id)) and r.state in ("done", "failed")
            and r)
        assert done.state == "done", done.result
        groups = done.result["groups"]
        training = [g for g in groups if g["training"]]
        assert {r for g in training for r in g["ranks"]} == {0, 1}
        assert all("run_training" in g["stack"] for g in training)
        # in a step (rank 1 sleeping before it, rank 0 waiting for it in the all-reduce), or
        # in the checkpoint both save every 6 steps, where a loaded host can keep them a while
        assert any(f in g["stack"] for g in training
                   for f in ("_one_step", "before_step", "maybe_save")), \
            [g["stack"] for g in training]
        merged = [g for g in groups if g["ranks"] == [0, 1]]
        assert merged, "identical stacks of both ranks are merged"  # e.g. the heartbeat thread
        assert any("meshyard-heartbeat" in t for g in merged for t in g["threads"])
        # py-spy is installed with the test dependencies: every rank's native stacks too
        native = done.result["native"]
        assert sorted(r for g in native for r in g["ranks"]) == [0, 1], native
        assert all(g["text"].startswith("Process ") and "Thread " in g["text"] for g in native)

        job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
        assert job.state == JobState.SUCCEEDED, job.message

        rows = store.list_metrics(job_id, rank=0)
        assert [m.step for m in rows] == list(range(1, 25))
        assert {m.lr for m in rows} == {0.02} and all(m.grad_norm is not None for m in rows)

        ckpts = store.list_checkpoints(job_id)
        assert [(c.step, c.removed) for c in ckpts] == [(6, True), (12, True), (18, False),
                                                        (24, False)]
        assert all(c.size_bytes and c.size_bytes > 1000 and "step_" in c.path for c in ckpts)

        usage = store.list_rank_usage(job_id)
        assert {u.rank for u in usage} == {0, 1}
        assert all(u.rss_bytes and u.rss_bytes > 50 * 2**20 for u in usage)
        assert any((u.cpu_percent or 0) > 0 for u in usage)
        assert all(u.gpu_util is None and u.node in ("n1", "n2") for u in usage)
        nodes = until("node samples", lambda: {u.node for u in store.list_node_usage()}
                      >= {"n1", "n2", "c1"} and store.list_node_usage())
        assert all((u.mem_total_bytes or 0) > 2**30 and u.gpus == [] for u in nodes)
    finally:
        rt.stop()
