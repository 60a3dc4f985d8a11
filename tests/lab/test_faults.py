"""Faults injected mid-training on the lab: a 2-rank built-in job across two of three Ray hosts,
the control plane (`meshyard serve`) on a fourth host without Ray resources, its checkpoints
on the lab's object store (an S3-compatible server on that host; each Ray host keeps its
ranks' files on its own private disk and uploads them).
Each test leaves the lab as it found it (a killed host's Ray is started again, a pulled link is
put back).

The control plane, the job and the client on the head that watches it: deploy/lab/jobs.py."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from deploy.lab import jobs as labjobs
from deploy.lab import lab as labmod
from deploy.lab.jobs import CHECKPOINTED, SPEC, Watch, failed, node_state, serve_pids, training
from orchestrator.lifecycle import FAILURE_REASONS

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def lab() -> Iterator[labmod.Lab]:
    why = labmod.lab_available()
    if why:
        pytest.skip(f"lab unavailable: {why}")
    built = labjobs.up(3)  # removes what it made when it fails
    try:
        yield built
    finally:
        left = labmod.down()
        assert not left, f"lab down left behind: {left}"


@pytest.fixture
def watch(lab: labmod.Lab) -> Iterator[Callable[..., Watch]]:
    """Submits a job and watches it (`Watch`); a job still running when its test ends (a
    failed assertion) is cancelled, so the next test gets the lab's hosts free."""
    made: list[Watch] = []

    def make(log: str, spec: dict[str, Any] = SPEC) -> Watch:
        made.append(Watch(lab, log, spec))
        return made[-1]

    yield make
    for w in made:
        try:
            if any("job" in x for x in w.lines()):
                w.cancel()
        except Exception as exc:  # the test's own failure is the one to report
            print(f"{w.path.name}: the job was not cancelled: {str(exc)[:500]}")


def _resumed_elsewhere(w: Watch, victim: str) -> None:
    ranks = w.wait("attempt 2 training", lambda w: training(w, 2, 5), timeout=300)
    assert victim not in {r[1] for r in ranks}
    assert len({r[1] for r in ranks}) == 2
    w.cancel()


def test_host_crash_is_diagnosed_naming_the_host_and_the_job_resumes_elsewhere(
        lab: labmod.Lab, watch: Callable[..., Watch]):
    """The job checkpoints to the object store, each host uploading its rank's part; attempt 2,
    on other hosts, resumes from the newest checkpoint complete there (downloaded to its hosts'
    own disks), and retraces attempt 1's steps after it exactly."""
    w = watch("watch-crash.log", CHECKPOINTED)
    ranks = w.wait("attempt 1 training", lambda w: training(w, 1, 25), timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 1))
    t0 = time.time()
    lab.kill_host(victim)
    try:
        stored = w.wait("the attempt's failure", failed, timeout=120)
        print(f"host crash: failure stored {time.time() - t0:.1f} s after the kill")
        assert f"rank 1 on {victim.name}" in stored["message"]
        assert "unreachable" in stored["message"]
        assert node_state(w, victim.name) in ("suspect", "cordoned")
        _resumed_elsewhere(w, victim.name)
        _resumed_from_the_store(lab, w)
    finally:
        lab.start_ray(victim)  # the host comes back, as a rebooted machine does
        lab.wait_nodes(4)


def _resumed_from_the_store(lab: labmod.Lab, w: Watch) -> None:
    saved = w.client("[c.model_dump(mode='json') for c in c.checkpoints(JOB).items]")
    first = [c for c in saved if c["attempt"] == 1]
    assert first, saved
    newest = max(first, key=lambda c: c["step"])
    uri = labjobs.store_env(lab)["MESHYARD_CHECKPOINT_URI"]
    assert newest["path"] == f"{uri}/{w.job}/step_{newest['step']:08d}", newest
    if not newest["removed"]:  # each host uploaded its own rank's part
        prefix = f"step_{newest['step']:08d}/"
        names = {k[len(prefix):] for k in labjobs.store_keys(lab, w.job) if k.startswith(prefix)}
        assert {"COMPLETE", ".metadata", "rng/rank_0.pt", "rng/rank_1.pt"} <= names, names
    rows = w.client("[[m.attempt, m.step, m.loss] for m in c.metrics(JOB, rank=0).items]")
    second = {step: loss for attempt, step, loss in rows if attempt == 2}
    assert min(second) == newest["step"] + 1, (newest["step"], sorted(second)[:5])
    # The steps both attempts made with a loss (rows get it at the loop's sync steps): the
    # same weights, optimizer state, RNG and data position give the same loss.
    both = {step: (loss, second[step]) for attempt, step, loss in rows
            if attempt == 1 and step in second and loss is not None
            and second[step] is not None}
    print(f"host crash: resumed at step {newest['step'] + 1}; {len(both)} retraced steps")
    for step, (one, two) in both.items():
        assert abs(one - two) <= 1e-6 * max(1.0, abs(one)), (step, one, two)


def test_partition_is_diagnosed_unreachable_naming_the_host_and_the_job_resumes_elsewhere(
        lab: labmod.Lab, watch: Callable[..., Watch]):
    w = watch("watch-partition.log")
    ranks = w.wait("attempt 1 training", lambda w: training(w, 1, 20), timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 1))
    t0 = time.time()
    lab.link_down(victim)
    try:
        diag = w.wait("a diagnosis naming the host", lambda w: next(
            (e for e in w.events() if e["message"].startswith("diagnosis")
             and victim.name in e["message"]), None), timeout=300)
        print(f"partition: diagnosis stored {time.time() - t0:.1f} s after the link went down")
        assert "unreachable" in diag["message"]
        stored = w.wait("the attempt's failure", failed, timeout=180)
        # ended by the gang once the rank answered nothing for 15 s while its peer did, not
        # when Ray declares the node dead (about a minute) or the collective times out
        assert f"rank 1 on {victim.name}" in stored["message"], stored["message"]
        assert "answered no call for" in stored["message"], stored["message"]
        assert node_state(w, victim.name) in ("suspect", "cordoned")
        _resumed_elsewhere(w, victim.name)
    finally:
        lab.link_up(victim)
        # Ray declared the cut-off node dead; its Ray is started again, as an operator would
        lab.kill_host(victim)
        lab.start_ray(victim)
        lab.wait_nodes(4)


def test_control_plane_killed_and_restarted_on_its_host_loses_nothing_and_the_job_trains_on(
        lab: labmod.Lab, watch: Callable[..., Watch]):
    """`meshyard serve` killed -9 on its own host mid-training and started again there: the
    job trains on through the outage in its first attempt (its controller is a detached Ray
    actor on the cluster), the new control plane reattaches to it, and every step's metrics
    row reaches the database once, those reported while no control plane ran included."""
    w = watch("watch-cp.log")
    ranks = w.wait("attempt 1 training", lambda w: training(w, 1, 20), timeout=300)
    pids = serve_pids(lab)
    assert pids, "no meshyard serve process found on the control plane's host"
    at_kill, t0 = max(r[2] for r in ranks), time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while serve_pids(lab) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not serve_pids(lab), "meshyard serve survived SIGKILL"
    # Its command line is gone before its last thread has exited and closed the listening
    # socket (a process of many threads takes a while to end on a loaded host).
    deadline = time.monotonic() + 30
    while lab.tcp_connects(lab.head, lab.hosts[3].ip, labjobs.PORT, timeout=1.0) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert not lab.tcp_connects(lab.head, lab.hosts[3].ip, labjobs.PORT), \
        "the API still answers 30 s after its process was killed"
    labjobs.start_serve(lab)
    print(f"control plane restart: serving again {time.time() - t0:.1f} s after the kill")
    after = w.wait("attempt 1 training on after the restart",
                   lambda w: training(w, 1, at_kill + 40), timeout=300)
    assert {r[3] for r in after} == {1}
    assert w.client("[a.state for a in c.attempts(JOB).items]") == ["RUNNING"]
    failures = {r.value for r in FAILURE_REASONS}
    assert not [e for e in w.events() if e["reason"] in failures], w.events()
    w.cancel()
    steps = w.client("[m.step for m in c.metrics(JOB, rank=0).items]")
    assert steps == list(range(1, len(steps) + 1)), steps  # every step once: none lost
    assert len(steps) >= at_kill + 40


def test_full_run_dir_disk_fails_the_save_naming_host_and_path_and_nothing_half_saved_is_resumed(
        lab: labmod.Lab, watch: Callable[..., Watch]):
    """Rank 1's host's own disk (its run dirs, where the rank writes its part of each
    checkpoint) fills up mid-training: the next save fails naming the step, the host, the
    path and "No space left on device"; that step never gets a marker in the store; once
    space is back the restarted attempt resumes from the newest checkpoint complete there."""
    w = watch("watch-disk.log", CHECKPOINTED)
    ranks = w.wait("attempt 1 training", lambda w: training(w, 1, 12), timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 1))
    uri = labjobs.store_env(lab)["MESHYARD_CHECKPOINT_URI"]
    filled = lab.fill_disk(victim, labmod.RUN_DIR)
    try:
        stored = w.wait("the failed save", lambda w: next(
            (e for e in w.events() if "was not saved" in e["message"]), None), timeout=180)
        print(f"full disk: {filled} bytes filled; stored: {stored['message'][:400]}")
        text = stored["message"]
        folder = f"{labmod.RUN_DIR}/meshyard/runs/{w.job}/checkpoints/step_"
        assert "No space left on device" in text and folder in text, text
        assert f" was not saved on {victim.name}" in text, text
        assert f"a restart resumes from the newest checkpoint complete in {uri}" in text, text
        unsaved = int(text.split("the checkpoint of step ", 1)[1].split()[0])
    finally:
        lab.free_disk(victim, labmod.RUN_DIR)
    w.wait("attempt 2 training", lambda w: training(w, 2, 3), timeout=300)
    # What attempt 1 made complete in the store: its checkpoints in the job's list (attempt 2
    # trains fast and saves, and may save the same step number again, in its own name)
    saved = w.client("[[c.attempt, c.step] for c in c.checkpoints(JOB).items]")
    kept = sorted(step for attempt, step in saved if attempt == 1)
    assert kept and kept[-1] < unsaved and unsaved not in kept, (saved, unsaved)
    # Rank 0's metric rows reach the store at the loop's sync steps, after the heartbeats that
    # said attempt 2 is training: wait for its first ones
    resumed = w.wait("attempt 2's metric rows", lambda w: [step for attempt, step in w.client(
        "[[m.attempt, m.step] for m in c.metrics(JOB, rank=0).items]") if attempt == 2],
        timeout=120)
    assert min(resumed) == kept[-1] + 1
    w.cancel()


def test_a_link_down_for_5_s_is_a_link_gap_not_a_restart(lab: labmod.Lab,
                                                         watch: Callable[..., Watch]):
    """A flapping link: rank 1's host is cut off for 5 s, then back. The collective waits and
    recovers (TCP retransmits), the job keeps its attempt, and the job's events hold a
    LINK_GAP warning naming the host and how long it answered nothing."""
    w = watch("watch-flap.log")
    ranks = w.wait("attempt 1 training", lambda w: training(w, 1, 20), timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 1))
    at = max(r[2] for r in ranks)
    lab.link_down(victim)
    try:
        time.sleep(5)
    finally:
        lab.link_up(victim)
    gap = w.wait("a link gap", lambda w: next(
        (e for e in w.events() if e["reason"] == "LINK_GAP"), None), timeout=120)
    print(f"flapping link: {gap['message']}")
    assert f"on {victim.name} ({victim.ip})" in gap["message"]
    assert gap["data"]["silent_s"] >= 4.0
    w.wait("attempt 1 training on", lambda w: training(w, 1, at + 20), timeout=180)
    assert w.client("[a.state for a in c.attempts(JOB).items]") == ["RUNNING"]
    failures = {r.value for r in FAILURE_REASONS}
    assert not [e for e in w.events() if e["reason"] in failures], w.events()
    w.cancel()
