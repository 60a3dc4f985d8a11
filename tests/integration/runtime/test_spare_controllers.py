"""Spare controllers (orchestrator/runtime/spares.py): an attempt is run by a controller
started before it was submitted, its placement records that controller's name, the runtime
keeps a spare ready after each launch and kills its spares on stop; the orphan sweep kills a
spare nobody holds or records and leaves a held one and an adopted one alone."""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray

from orchestrator.lifecycle import JobState
from orchestrator.runtime.controller import RemoteController, controller_options, find_controller
from orchestrator.runtime.events import (
    NAMESPACE,
    controller_name,
    is_spare_controller_name,
    spare_controller_name,
)
from orchestrator.runtime.poller import sweep_orphans
from orchestrator.settings import Settings
from tests.integration.runtime.conftest import (
    package_settings,
    submit,
    tiny_spec,
    wait_for,
    wait_state,
)


@pytest.fixture()
def settings(tmp_path, ray_cluster) -> Settings:
    """The package's settings with the default spare controller kept."""
    return package_settings(tmp_path, ray_cluster, spare_controllers=1)


def _spares_in_ray() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == NAMESPACE and is_spare_controller_name(a["name"])}


def _wait_spare(rt: Any, *, other_than: set[str] = frozenset(), up: bool = True) -> str:
    """A spare held by `rt` (not one of `other_than`), in Ray and, with `up`, answering."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = (rt.spares.ready() if up else rt.spares.names()) - other_than
        if names and (not up or names <= _spares_in_ray()):
            return next(iter(names))
        time.sleep(0.1)
    raise AssertionError(f"no new spare controller: held {rt.spares.names()}, "
                         f"in Ray {_spares_in_ray()}")


def test_an_attempt_adopts_a_spare_which_is_replaced_and_killed_with_its_attempt(
        runtime, store):
    spare = _wait_spare(runtime)
    assert ray.get(ray.get_actor(spare, namespace=NAMESPACE).poll.remote(), timeout=30) \
        .job_id == ""  # idle: no attempt yet
    job_id = submit(store, tiny_spec("on-a-spare", checkpoint={"enabled": False}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.SUCCEEDED, job.message
    (attempt,) = store.list_attempts(job_id)
    assert attempt.placement["controller"] == spare
    assert find_controller(job_id, 1, controller_name(job_id, 1)) is None  # none made for it
    wait_for(store, job_id, lambda _: find_controller(job_id, 1, spare) is None,
             what="the adopted spare killed with its attempt")
    assert _wait_spare(runtime, other_than={spare}) != spare  # a new one ready
    held = runtime.spares.names()
    runtime.stop()
    assert not (held & _spares_in_ray()), "stop leaves no spare behind"


def test_the_sweep_kills_a_spare_nobody_holds_and_keeps_held_and_adopted_ones(
        runtime, store):
    _wait_spare(runtime)
    job_id = submit(store, tiny_spec("long", training={"steps": 100_000},
                                     checkpoint={"enabled": False}))
    wait_for(store, job_id, lambda j: j.state == JobState.RUNNING and (j.last_step or 0) >= 2,
             what="RUNNING with steps")
    adopted = store.list_attempts(job_id)[-1].placement["controller"]
    assert is_spare_controller_name(adopted)
    held = _wait_spare(runtime, other_than={adopted})
    stray = spare_controller_name("0rphan")  # as a control plane that died leaves one
    RemoteController.options(**controller_options(stray, None)).remote()
    deadline = time.monotonic() + 30
    while stray not in _spares_in_ray() and time.monotonic() < deadline:
        time.sleep(0.1)
    sweep_orphans(store, spares=runtime.spares.names())  # (the runtime's own sweeps too)
    deadline = time.monotonic() + 30
    while stray in _spares_in_ray() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _spares_in_ray()
    assert stray not in left
    assert adopted in left and held in left
    step = store.get_job(job_id).last_step or 0
    wait_for(store, job_id, lambda j: (j.last_step or 0) > step + 2,
             what="still training after the sweep")
    store.request_cancel(job_id, viewer=None)
    assert wait_state(store, job_id, JobState.CANCELLED, JobState.FAILED, timeout_s=60).state \
        == JobState.CANCELLED


def test_a_restarted_control_plane_finds_the_spare_its_attempt_adopted(settings, store):
    from orchestrator.runtime.service import Runtime

    first = Runtime(settings, store, tick_s=0.2, warm_pool=0)
    first.start()
    try:
        _wait_spare(first)
        job_id = submit(store, tiny_spec("outlives", training={"steps": 100_000},
                                         checkpoint={"enabled": False}))
        wait_for(store, job_id, lambda j: j.state == JobState.RUNNING
                 and (j.last_step or 0) >= 2, what="RUNNING with steps")
    finally:
        first.stop()  # the control plane goes; the attempt's controller stays
    adopted = store.list_attempts(job_id)[-1].placement["controller"]
    assert is_spare_controller_name(adopted) and adopted in _spares_in_ray()
    second = Runtime(settings, store, tick_s=0.2, warm_pool=0)
    second.start()
    try:
        step = store.get_job(job_id).last_step or 0
        wait_for(store, job_id, lambda j: (j.last_step or 0) > step + 2,
                 what="polled again by the new control plane")
        assert adopted in _spares_in_ray()  # its sweep kept it
        assert len(store.list_attempts(job_id)) == 1  # the same attempt goes on
        store.request_cancel(job_id, viewer=None)
        assert wait_state(store, job_id, JobState.CANCELLED, JobState.FAILED,
                          timeout_s=60).state == JobState.CANCELLED
        wait_for(store, job_id, lambda _: adopted not in _spares_in_ray(),
                 what="the adopted spare killed with its attempt")
    finally:
        second.stop()


def _never_starting(monkeypatch) -> None:
    """Spares that ask for a resource no node has, on no node in particular (a hard node
    affinity would make Ray fail them at once): their actors stay pending, as a spare whose
    worker process a loaded host has not started yet."""
    from orchestrator.runtime.spares import SpareControllers

    plain = SpareControllers._options
    monkeypatch.setattr(SpareControllers, "_options", lambda self, name: {
        **{k: v for k, v in plain(self, name).items() if k != "scheduling_strategy"},
        "resources": {"meshyard-test-absent": 1}})


def test_a_spare_still_starting_is_passed_over_and_a_dead_one_dropped(monkeypatch, ray_cluster):
    from orchestrator.runtime.spares import SpareControllers

    _never_starting(monkeypatch)
    spares = SpareControllers(2, near_node_id=None)
    try:
        assert spares.top_up() == 2
        names = spares.names()
        assert len(names) == 2 and names <= _spares_in_ray()
        assert spares.take() is None  # neither has answered its first call
        assert spares.names() == names  # kept: each may still come up
        first, second = (h for _, h, _ in spares._idle)
        ray.kill(first, no_restart=True)  # dies before it ever ran
        deadline = time.monotonic() + 30
        while len(spares.names()) == 2 and time.monotonic() < deadline:
            assert spares.take() is None  # the dead one is never handed out
            time.sleep(0.1)
        assert len(spares.names()) == 1, "a spare that died is dropped"
        assert spares.top_up() == 1  # and replaced
    finally:
        assert spares.close() == 2
    deadline = time.monotonic() + 30
    while names & _spares_in_ray() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (names & _spares_in_ray())


def test_a_launch_does_not_wait_for_a_spare_that_has_not_started(
        monkeypatch, settings, store):
    from orchestrator.runtime.service import Runtime

    _never_starting(monkeypatch)
    rt = Runtime(settings, store, tick_s=0.2, warm_pool=0)
    rt.start()
    try:
        _wait_spare(rt, up=False)
        pending = rt.spares.names()
        assert not rt.spares.ready()
        t0 = time.monotonic()
        job_id = submit(store, tiny_spec("no-spare-up", checkpoint={"enabled": False}))
        job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED)
        assert job.state == JobState.SUCCEEDED, job.message
        (attempt,) = store.list_attempts(job_id)  # one attempt: no launch failed on the spare
        assert attempt.placement["controller"] == controller_name(job_id, 1)
        assert rt.spares.names() == pending  # the spare was left to start, not taken
        print(f"[spares] launched past a pending spare; done in {time.monotonic() - t0:.1f} s")
        assert all(_named(n) for n in pending)
    finally:
        rt.stop()
    deadline = time.monotonic() + 30
    while any(_named(n) for n in pending) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_named(n) for n in pending), "stop kills spares that never started"


def _named(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True
