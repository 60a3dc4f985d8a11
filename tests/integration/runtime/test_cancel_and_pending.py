"""Cancellation (while RUNNING, while PLACING), placement timeout, and "why pending" without
head-of-line blocking, on one shared simulated cluster (n1, n2: 2 fake GPUs each)."""

from __future__ import annotations

import time

import ray

from orchestrator.lifecycle import JobState
from orchestrator.runtime.controller import find_controller, recorded_controller_name
from tests.integration.runtime.conftest import submit, tiny_spec, wait_for, wait_state


def _pg_gone(job_id: str, timeout_s: float = 60.0) -> bool:
    """Every placement group of the job removed (removal is asynchronous in Ray; a group
    left by a race is swept by the runtime within 30 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(p["state"] == "REMOVED" for p in ray.util.placement_group_table().values()
               if p["name"].startswith(f"meshyard-pg-{job_id}-")):
            return True
        time.sleep(0.2)
    return False


def test_cancel_while_running_stops_workers_and_frees_the_gang(runtime, store):
    job_id = submit(store, tiny_spec("long", training={"steps": 100000}))
    wait_for(store, job_id, lambda j: j.state == JobState.RUNNING and (j.last_step or 0) >= 2,
             what="RUNNING with steps")
    # The diagnostics side channel answers while the ranks train (hang watchdog contract).
    n = store.get_job(job_id).current_attempt
    name = recorded_controller_name(store, job_id, n)  # a spare the attempt adopted
    ctrl = find_controller(job_id, n, name)
    assert ctrl is not None, name
    evidence = ray.get(ctrl.diagnostics.remote("t1"), timeout=60)
    assert sorted(evidence) == [0, 1]
    assert all(e["stacks"] and e["state"] == "running" for e in evidence.values())
    assert all("evidence" in e or "evidence_error" in e for e in evidence.values())
    t0 = time.monotonic()
    store.request_cancel(job_id, viewer=None)
    job = wait_state(store, job_id, JobState.CANCELLED, JobState.FAILED, timeout_s=30)
    print(f"cancel while RUNNING took {time.monotonic() - t0:.1f} s")
    assert job.state == JobState.CANCELLED
    assert [e.dst for e in store.list_events(job_id) if e.kind == "state"][-2:] == \
        ["CANCELLING", "CANCELLED"]
    assert _pg_gone(job_id)
    assert find_controller(job_id, n, name) is None
    assert store.list_attempts(job_id)[-1].state == "CANCELLED"


def test_cancel_while_placing(runtime, store):
    # The solver counts GPUs only; 8 CPUs per worker can never be reserved on a 2-CPU node,
    # so the gang reservation stays pending and the job stays PLACING.
    job_id = submit(store, tiny_spec("unreservable", resources={"cpus_per_worker": 8},
                                     placement={"timeout_s": 120}))
    wait_state(store, job_id, JobState.PLACING)
    time.sleep(1.0)  # let the controller start waiting on the group
    store.request_cancel(job_id, viewer=None)
    job = wait_state(store, job_id, JobState.CANCELLED, JobState.FAILED, timeout_s=30)
    assert job.state == JobState.CANCELLED
    assert _pg_gone(job_id)


def test_placement_timeout_returns_the_job_to_queued_with_the_reason(runtime, store):
    job_id = submit(store, tiny_spec("timeout", resources={"cpus_per_worker": 8},
                                     placement={"timeout_s": 1}))
    job = wait_for(store, job_id, lambda j: any(
        e.reason == "PLACEMENT_TIMEOUT" for e in store.list_events(j.id)), what="timeout")
    back = [e for e in store.list_events(job_id) if e.reason == "PLACEMENT_TIMEOUT"][0]
    assert (back.src, back.dst) == ("PLACING", "QUEUED")
    assert "not ready after 1 s" in back.message
    assert store.list_attempts(job_id)[0].state == "PLACEMENT_TIMEOUT"
    store.request_cancel(job_id, viewer=None)
    job = wait_state(store, job_id, JobState.CANCELLED, timeout_s=30)
    assert _pg_gone(job.id)


def test_infeasible_job_fails_after_the_placement_timeout_unless_it_waits_for_capacity(
        runtime, store):
    never = submit(store, tiny_spec("never-fits", parallelism={"dp_replicate": 8},
                                    placement={"timeout_s": 2}))
    patient = submit(store, tiny_spec("autoscaled", parallelism={"dp_replicate": 8},
                                      placement={"timeout_s": 2, "wait_for_capacity": True}))
    job = wait_state(store, never, JobState.FAILED, timeout_s=60)
    assert job.failure_reason == "INFEASIBLE"
    assert job.message.startswith("the job needs 8 GPUs")
    assert "placement.wait_for_capacity" in job.message
    other = store.get_job(patient)
    assert other.state == JobState.QUEUED and other.pending_reason["kind"] == "infeasible"
    # `patient` was found infeasible in the same pass as `never`, a moment after it: let its
    # own 2 s run out with a margin, then it must still be waiting.
    time.sleep(max(0.0, other.pending_reason["infeasible_since"] + 3 - time.time()))
    other = store.get_job(patient)
    assert other.state == JobState.QUEUED and other.pending_reason["kind"] == "infeasible"
    assert time.time() - other.pending_reason["infeasible_since"] >= 3
    store.request_cancel(patient, viewer=None)
    wait_state(store, patient, JobState.CANCELLED)


def test_infeasible_job_says_why_and_does_not_block_smaller_ones(runtime, store):
    big = submit(store, tiny_spec("too-big", priority=10, parallelism={"dp_replicate": 8}))
    small = submit(store, tiny_spec("small"))
    wait_state(store, small, JobState.RUNNING, JobState.SUCCEEDED)
    # While `small` holds 2 of the 4 GPUs, a 4-GPU job has to wait, and says so with numbers.
    waiting = submit(store, tiny_spec("waits", parallelism={"dp_replicate": 4}))
    job = wait_for(store, waiting, lambda j: j.pending_reason is not None or
                   j.state != JobState.QUEUED, what="a pending reason")
    big_job = store.get_job(big)
    assert big_job.state == JobState.QUEUED
    reason = big_job.pending_reason
    assert reason["kind"] == "infeasible"
    assert reason["needed_gpus"] == 8 and reason["total_gpus"] == 4
    assert "needs 8 GPUs" in reason["message"]
    if job.state == JobState.QUEUED:  # `small` may already have finished on a fast machine
        # the first GPU job in line holds a reservation (scheduling/reservation.py)
        assert job.pending_reason["kind"] in ("waiting", "fragmented", "reserved")
        assert job.pending_reason["needed_gpus"] == 4
    small_job = wait_state(store, small, JobState.SUCCEEDED, JobState.FAILED)
    assert small_job.state == JobState.SUCCEEDED, small_job.message
    for j in (big, waiting):
        store.request_cancel(j, viewer=None)
        wait_state(store, j, JobState.CANCELLED)


def test_a_submission_and_a_cancel_through_the_api_act_before_the_next_tick(settings, store):
    """With a 60 s tick, the scheduler places a job submitted through the API, and the
    poller acts on a cancel sent through it, without waiting for the tick."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from orchestrator.runtime.service import Runtime

    rt = Runtime(settings, store, tick_s=60, warm_pool=0)
    store.ensure_admin("tick-admin-token")
    auth = {"Authorization": "Bearer tick-admin-token"}
    with TestClient(create_app(settings, store=store, runtime=rt),
                    base_url="http://127.0.0.1:8470") as client:
        time.sleep(1.0)  # the loops' first passes are done: the next tick is a minute away
        r = client.post("/v1/jobs", json=tiny_spec(
            "woken", resources={"cpus_per_worker": 8}, placement={"timeout_s": 120}),
            headers=auth)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_state(store, job_id, JobState.PLACING, timeout_s=15)
        r = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
        assert r.status_code == 200, r.text
        # The poke sends the cancel to the controller; its outcome is seen on a later pass.
        deadline = time.monotonic() + 30
        while store.get_job(job_id).state != JobState.CANCELLED:
            assert time.monotonic() < deadline, store.get_job(job_id)
            rt.poke()
            time.sleep(0.5)
    assert _pg_gone(job_id)
