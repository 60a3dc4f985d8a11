"""Faults injected mid-training on the lab: a 2-rank built-in job across two of three Ray hosts,
the control plane (`meshyard serve`) on a fourth host without Ray resources, its checkpoint
storage the lab's shared storage (every host mounts it at one path, as NFS on a real cluster).
Each test leaves the lab as it found it (a killed host's Ray is started again, a pulled link is
put back).

A client on the head submits the job and logs, as JSON lines, the job's state, ranks and new
events every half second; the tests wait on that log with generous bounds."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.lab import lab as labmod
from orchestrator.lifecycle import FAILURE_REASONS

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

TOKEN = "lab-admin-token-" + "0" * 24
PORT = 8470

_WATCH = r"""
import json, sys, time
from api.client import MeshyardClient
c = MeshyardClient(sys.argv[1], sys.argv[2])
job = c.submit(json.loads(sys.argv[3]))
print(json.dumps({"job": job.id}), flush=True)
seen = 0
while True:
    try:
        j = c.get_job(job.id)
        for e in c.events(job.id, after=seen):
            seen = max(seen, e.id)
            print(json.dumps({"t": time.time(), "event": e.model_dump(mode="json")}), flush=True)
        ranks = [[r.rank, r.node, r.step or 0, r.attempt] for r in c.ranks(job.id).items]
        print(json.dumps({"t": time.time(), "state": j.state.value,
                          "attempt": j.current_attempt, "ranks": ranks}), flush=True)
        if j.state.value in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
    except Exception as exc:
        print(json.dumps({"t": time.time(), "error": repr(exc)[:300]}), flush=True)
    time.sleep(0.5)
"""

_SPEC = {"version": 1, "name": "lab-fault",
         "resources": {"device": "cpu", "cpus_per_worker": 2},  # a whole host a rank
         "parallelism": {"dp_replicate": 2},
         "model": {"kind": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 32, "vocab_size": 64,
                   "seq_len": 16},
         "training": {"steps": 5000, "micro_batch_size": 2, "lr": 0.003},
         "checkpoint": {"enabled": False},
         "fault_tolerance": {"max_failures": 1}}


def _start_serve(lab: labmod.Lab) -> None:
    """`meshyard serve` on the control plane's host (its database on that host's disk)."""
    cp = lab.hosts[3]
    lab.spawn_in(cp, [f"{sys.prefix}/bin/meshyard", "serve", "--host", cp.ip,
                      "--port", str(PORT), "--data-dir", f"{labmod.RUN_DIR}/meshyard",
                      "--checkpoint-storage", labmod.STORAGE_DIR,
                      "--ray-address", lab.ray_address, "--no-access-log"],
                 log="serve.log", env={"MESHYARD_ADMIN_TOKEN": TOKEN,
                                       "MESHYARD_WARM_POOL_USER_CODE": "0"})
    lab.wait_port(cp, PORT, timeout=180)


def _serve_pids(lab: labmod.Lab) -> set[int]:
    """The control plane's host's `meshyard serve` processes."""
    out = set()
    for pid in lab.host_pids(lab.hosts[3]):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/meshyard") for a in argv[:2]) and b"serve" in argv:
            out.add(pid)
    return out


@pytest.fixture(scope="module")
def lab() -> Iterator[labmod.Lab]:
    why = labmod.lab_available()
    if why:
        pytest.skip(f"lab unavailable: {why}")
    built = labmod.up(3, plain=1)  # removes what it made when it fails
    try:
        cp = built.hosts[3]
        built.start_ray(cp, cpus=0, gpus=0)
        built.wait_nodes(4)
        _start_serve(built)
        yield built
    finally:
        left = labmod.down()
        assert not left, f"lab down left behind: {left}"


class Watch:
    """The head's client: submits the job and logs what it sees."""

    def __init__(self, lab: labmod.Lab, log: str, spec: dict[str, Any] = _SPEC) -> None:
        self.lab, self.path = lab, lab.head.dir / log
        self.url = f"http://{lab.hosts[3].ip}:{PORT}"
        lab.spawn_in(lab.head, [sys.executable, "-c", _WATCH, self.url, TOKEN,
                                json.dumps(spec)], log=log)

    def lines(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text()
        except OSError:
            return []
        return [json.loads(x) for x in text.splitlines() if x.startswith("{")]

    def states(self) -> list[dict[str, Any]]:
        return [x for x in self.lines() if "state" in x]

    def events(self) -> list[dict[str, Any]]:
        return [x["event"] for x in self.lines() if "event" in x]

    def wait(self, what: str, cond: Callable[[Watch], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond(self)
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"{what} not seen in {timeout:g} s; events: "
                             f"{[(e['reason'], e['message'][:200]) for e in self.events()]}; "
                             f"{self.lab.log_tail(self.lab.hosts[3], 'serve.log')}")

    def client(self, call: str) -> Any:
        job = next(x["job"] for x in self.lines() if "job" in x)
        code = (f"import json\nfrom api.client import MeshyardClient\n"
                f"with MeshyardClient({self.url!r}, {TOKEN!r}) as c:\n"
                f"    print(json.dumps({call.replace('JOB', repr(job))}))")
        proc = self.lab.python_in(self.lab.head, code, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _training(w: Watch, attempt: int, step: int) -> list[list[Any]] | None:
    st = w.states()
    if st and st[-1]["attempt"] == attempt and len(st[-1]["ranks"]) == 2 and \
            all(r[2] >= step and r[3] == attempt for r in st[-1]["ranks"]):
        return st[-1]["ranks"]
    return None


def _failed(w: Watch) -> dict[str, Any] | None:
    return next((e for e in w.events() if e["reason"] in ("WORKER_CRASH", "HANG_DETECTED")
                 and "allowed" in e["message"]), None)


def _node_state(w: Watch, node: str) -> str:
    nodes = w.client("[n.model_dump(mode='json') for n in c.list_nodes().items]")
    return next((n["state"] for n in nodes if n["name"] == node), "healthy")


def _resumed_elsewhere(w: Watch, victim: str) -> None:
    ranks = w.wait("attempt 2 training", lambda w: _training(w, 2, 5), timeout=300)
    assert victim not in {r[1] for r in ranks}
    assert len({r[1] for r in ranks}) == 2
    w.client("c.cancel(JOB).state.value")
    w.wait("the job cancelled", lambda w: w.states() and w.states()[-1]["state"] == "CANCELLED",
           timeout=120)


def test_host_crash_is_diagnosed_naming_the_host_and_the_job_resumes_elsewhere(
        lab: labmod.Lab):
    """The job checkpoints to the shared storage; attempt 2, on other hosts, resumes from the
    newest complete checkpoint there, and retraces attempt 1's steps after it exactly."""
    spec = {**_SPEC, "checkpoint": {"enabled": True, "every_steps": 10, "keep": 2,
                                    "async_save": False}}
    w = Watch(lab, "watch-crash.log", spec)
    ranks = w.wait("attempt 1 training", lambda w: _training(w, 1, 25), timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 1))
    t0 = time.time()
    lab.kill_host(victim)
    try:
        failed = w.wait("the attempt's failure", _failed, timeout=120)
        print(f"host crash: failure stored {time.time() - t0:.1f} s after the kill")
        assert f"rank 1 on {victim.name}" in failed["message"]
        assert "unreachable" in failed["message"]
        assert _node_state(w, victim.name) in ("suspect", "cordoned")
        _resumed_elsewhere(w, victim.name)
        _resumed_from_shared_storage(w)
    finally:
        lab.start_ray(victim)  # the host comes back, as a rebooted machine does
        lab.wait_nodes(4)


def _resumed_from_shared_storage(w: Watch) -> None:
    saved = w.client("[c.model_dump(mode='json') for c in c.checkpoints(JOB).items]")
    first = [c for c in saved if c["attempt"] == 1]
    assert first, saved
    newest = max(first, key=lambda c: c["step"])
    folder = Path(newest["path"])
    job = next(x["job"] for x in w.lines() if "job" in x)
    assert folder.parent == Path(labmod.STORAGE_DIR) / job, newest
    if not newest["removed"]:  # written by both hosts' ranks, seen from a third place
        names = {p.relative_to(folder).as_posix() for p in folder.rglob("*")}
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
        lab: labmod.Lab):
    w = Watch(lab, "watch-partition.log")
    ranks = w.wait("attempt 1 training", lambda w: _training(w, 1, 20), timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 1))
    t0 = time.time()
    lab.link_down(victim)
    try:
        diag = w.wait("a diagnosis naming the host", lambda w: next(
            (e for e in w.events() if e["message"].startswith("diagnosis")
             and victim.name in e["message"]), None), timeout=300)
        print(f"partition: diagnosis stored {time.time() - t0:.1f} s after the link went down")
        assert "unreachable" in diag["message"]
        w.wait("the attempt's failure", _failed, timeout=180)
        assert _node_state(w, victim.name) in ("suspect", "cordoned")
        _resumed_elsewhere(w, victim.name)
    finally:
        lab.link_up(victim)
        # Ray declared the cut-off node dead; its Ray is started again, as an operator would
        lab.kill_host(victim)
        lab.start_ray(victim)
        lab.wait_nodes(4)


def test_control_plane_killed_and_restarted_on_its_host_loses_nothing_and_the_job_trains_on(
        lab: labmod.Lab):
    """`meshyard serve` killed -9 on its own host mid-training and started again there: the
    job trains on through the outage in its first attempt (its controller is a detached Ray
    actor on the cluster), the new control plane reattaches to it, and every step's metrics
    row reaches the database once, those reported while no control plane ran included."""
    w = Watch(lab, "watch-cp.log")
    ranks = w.wait("attempt 1 training", lambda w: _training(w, 1, 20), timeout=300)
    pids = _serve_pids(lab)
    assert pids, "no meshyard serve process found on the control plane's host"
    at_kill, t0 = max(r[2] for r in ranks), time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _serve_pids(lab) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _serve_pids(lab), "meshyard serve survived SIGKILL"
    assert not lab.tcp_connects(lab.head, lab.hosts[3].ip, PORT), "the API still answers"
    _start_serve(lab)
    print(f"control plane restart: serving again {time.time() - t0:.1f} s after the kill")
    after = w.wait("attempt 1 training on after the restart",
                   lambda w: _training(w, 1, at_kill + 40), timeout=300)
    assert {r[3] for r in after} == {1}
    assert w.client("[a.state for a in c.attempts(JOB).items]") == ["RUNNING"]
    failures = {r.value for r in FAILURE_REASONS}
    assert not [e for e in w.events() if e["reason"] in failures], w.events()
    w.client("c.cancel(JOB).state.value")
    w.wait("the job cancelled", lambda w: w.states() and w.states()[-1]["state"] == "CANCELLED",
           timeout=120)
    steps = w.client("[m.step for m in c.metrics(JOB, rank=0).items]")
    assert steps == list(range(1, len(steps) + 1)), steps  # every step once: none lost
    assert len(steps) >= at_kill + 40
