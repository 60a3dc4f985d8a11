"""The hang watchdog end to end: real gloo jobs on Ray through the runtime, injected faults,
the controller's detection and evidence round, the stored report (the fault table of bench/README.md).

One runtime serves the whole module, on the package's Ray (conftest.py). Jobs are tiny (3
ranks unless the scenario needs 2), the stall threshold is 3 s, and `watchdog.action: fail`
ends a hung job as soon as its report is written, so no test waits for a collective timeout.
The tests run one job at a time: run side by side, the jobs miss the warm pool and Ray starts
more worker processes, which costs more CPU than the overlapped waits save.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from orchestrator.lifecycle import JobState  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from orchestrator.store import open_store  # noqa: E402
from orchestrator.store.repo import Store  # noqa: E402
from orchestrator.watchdog.condition import rank_states  # noqa: E402
from orchestrator.watchdog.report import DiagnosisReport  # noqa: E402
from tests.support.evidence import assert_probe_without_native  # noqa: E402
from tests.support.jobs import TERMINAL, submit, wait_for  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TINY = {"kind": "gpt", "n_layers": 2, "n_heads": 2, "d_model": 32, "vocab_size": 64,
        "seq_len": 16}


def hang_spec(name: str, *, world: int = 3, fault: dict[str, Any] | None = None,
              action: str = "fail", steps: int = 8, **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name, "parallelism": {"dp_replicate": world},
        "resources": {"cpus_per_worker": 0.25, "device": "cpu"},
        "model": dict(TINY),
        "training": {"steps": steps, "micro_batch_size": 2, "lr": 0.01},
        "checkpoint": {"enabled": False},
        "fault_tolerance": {"max_failures": 0, "init_timeout_s": 60, "collective_timeout_s": 60},
        "watchdog": {"stall_timeout_s": 3, "first_step_timeout_s": 120, "action": action},
    }
    if fault is not None:
        spec["inject_fault"] = fault
    spec.update(over)
    return spec


@pytest.fixture(scope="module")
def env(ray_connected: Any, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[Any, Store]]:
    from orchestrator.runtime.service import Runtime

    tmp = tmp_path_factory.mktemp("hangs")
    store = open_store(f"sqlite:///{tmp / 'meshyard.db'}")
    # Warm worker actors (torch imported) cut ~15 s of start per job on a loaded host; the
    # jobs here run the built-in loop, so the actors keep no prestarted rank process.
    rt = Runtime(Settings(data_dir=tmp, allow_fault_injection=True,
                          warm_pool_user_code=False), store, tick_s=0.2, warm_pool=3)
    try:
        rt.start()
        yield rt, store
    finally:
        rt.stop()
        store.close()


def terminal(store: Store, job_id: str) -> Any:
    job = wait_for(store, job_id, lambda j: j.state in TERMINAL, what="a terminal state")
    if os.environ.get("HANG_DEBUG"):
        for e in store.list_events(job_id):
            print(f"  {e.at:%H:%M:%S.%f} {e.kind} {e.dst} {e.reason} {e.message[:120]}")
    return job


def report_of(store: Store, job_id: str) -> Any:
    found = store.list_diagnoses(job_id)
    assert found, [(e.kind, e.reason, e.message[:200]) for e in store.list_events(job_id)]
    return found[-1]


def _show(name: str, d: Any) -> None:
    print(f"\n[hang] {name}: {d.verdict} {d.culprit_ranks} | {d.summary}")
    if os.environ.get("HANG_DEBUG"):
        import json
        print(json.dumps(d.report, indent=1, default=str)[:6000])


def test_hang_names_the_rank_that_never_joined_and_fails_the_job(env) -> None:
    _, store = env
    job_id = submit(store, hang_spec("hang", fault={"kind": "hang", "rank": 1, "step": 3}))
    job = terminal(store, job_id)
    d = report_of(store, job_id)
    _show("hang", d)
    assert (d.verdict, d.culprit_ranks) == ("NOT_JOINED", [1])
    assert "Rank 1" in d.summary and "never entered all_reduce" in d.summary
    assert job.state == JobState.FAILED and job.failure_reason == "HANG_DETECTED"
    assert len(store.list_diagnoses(job_id)) == 1  # the kill that follows is not news
    # Evidence: every rank's artifacts are kept under the run dir, in one stamped folder.
    arts = [Path(a) for a in d.report["artifacts"]]
    assert arts and all(a.exists() for a in arts)
    assert len({a.parent.parent for a in arts if a.name == "summary.json"}) == 1
    waiting = [e for e in d.report["evidence"] if e["rank"] != 1]
    assert all("all_reduce" in (e.get("top_of_stack") or "") or e["pgs"] for e in waiting)


def test_a_hang_seen_only_after_the_collective_timeout_still_names_the_rank_that_hung(
        env) -> None:
    """The stall threshold is far beyond the collective timeout: ranks 0 and 2 time out in
    the all-reduce rank 1 never enters and exit first, and the diagnosis taken then must name
    rank 1 (still running, hung), not the ranks that waited for it."""
    _, store = env
    spec = hang_spec("timed-out-first", fault={"kind": "hang", "rank": 1, "step": 3})
    spec["fault_tolerance"] = dict(spec["fault_tolerance"], collective_timeout_s=5)
    spec["watchdog"] = dict(spec["watchdog"], stall_timeout_s=120)
    job_id = submit(store, spec)
    job = terminal(store, job_id)
    d = report_of(store, job_id)
    _show("timed-out-first", d)
    assert (d.verdict, d.culprit_ranks) == ("NOT_JOINED", [1]), d.summary
    assert "ranks 0, 2 have since exited" in d.summary, d.summary
    assert job.state == JobState.FAILED


def test_crash_is_rank_exited_and_the_job_names_the_rank_that_died(env) -> None:
    _, store = env
    job_id = submit(store, hang_spec("crash", fault={"kind": "crash", "rank": 2, "step": 3}))
    job = terminal(store, job_id)
    d = report_of(store, job_id)
    _show("crash", d)
    assert (d.verdict, d.culprit_ranks) == ("RANK_EXITED", [2])
    # The message leads with the rank that died, not a peer's "Connection reset by peer".
    assert job.state == JobState.FAILED and job.failure_reason == "WORKER_CRASH"
    assert job.message.startswith("rank 2 on "), job.message
    # Its own last output, written just before the process exited, was recovered.
    lines = [x.line for x in store.list_logs(job_id, rank=2, limit=5000)]
    assert any("[meshyard fault] crash: rank 2 exits at step 3" in x for x in lines), lines[-5:]


def test_observed_hang_opens_a_condition_and_the_timeout_fails_it_naming_the_culprit(env):
    """watchdog.action observe: the job stays RUNNING but carries "hung since ..." with the
    ranks' states from the diagnosis; when the collective timeout fails the waiting peers,
    the job's reason and message come from the diagnosis, naming the culprit."""
    _, store = env
    spec = hang_spec("observed", action="observe", fault={"kind": "hang", "rank": 1, "step": 3})
    spec["fault_tolerance"] = dict(spec["fault_tolerance"], collective_timeout_s=10)
    job_id = submit(store, spec)
    job = wait_for(store, job_id, lambda j: j.condition is not None, what="a condition")
    assert job.state == JobState.RUNNING
    c = job.condition
    assert (c["kind"], c["verdict"], c["culprit_ranks"]) == ("hung", "NOT_JOINED", [1])
    assert c["text"].startswith("hung since ") and "rank 1 never entered all_reduce #" in c["text"]
    assert job.status == c["text"]
    found = store.get_diagnosis(job_id, c["diagnosis_id"])
    states = rank_states(DiagnosisReport.from_dict(found.report))
    assert states[1].state == "not_joined" and states[1].collective.startswith("all_reduce #")
    assert states[0].state == states[2].state == "waiting"
    job = terminal(store, job_id)
    assert job.state == JobState.FAILED and job.failure_reason == "HANG_DETECTED"
    assert job.message.startswith("hang detected: Rank 1 "), job.message
    assert job.condition is None


def test_condition_clears_when_progress_resumes(env) -> None:
    _, store = env
    job_id = submit(store, hang_spec("resumes", world=2, action="observe", steps=3,
                                     fault={"kind": "slow", "rank": 0, "step": 2, "seconds": 6}))
    wait_for(store, job_id, lambda j: j.condition is not None, what="a condition")
    job = terminal(store, job_id)
    assert job.state == JobState.SUCCEEDED and job.condition is None
    resumed = [e for e in store.list_events(job_id) if e.reason == "PROGRESS_RESUMED"]
    assert resumed and "no longer hung" in resumed[0].message


def test_size_mismatch_is_named_although_gloo_aborts(env) -> None:
    _, store = env
    job_id = submit(store, hang_spec("mismatch",
                                     fault={"kind": "mismatch", "rank": 1, "step": 3}))
    terminal(store, job_id)
    d = report_of(store, job_id)
    _show("mismatch", d)
    assert (d.verdict, d.culprit_ranks) == ("COLLECTIVE_MISMATCH", [1])
    (m,) = d.report["mismatches"]
    assert m["field"] == "sizes"


def test_desync_is_named(env) -> None:
    _, store = env
    job_id = submit(store, hang_spec("desync", fault={"kind": "desync", "rank": 0, "step": 3}))
    terminal(store, job_id)
    d = report_of(store, job_id)
    _show("desync", d)
    assert d.verdict in ("NOT_JOINED", "COLLECTIVE_MISMATCH")
    assert d.culprit_ranks == [0]


def test_p2p_stall_names_the_stage_that_never_sends(env) -> None:
    _, store = env
    spec = hang_spec("p2p", world=2, fault={"kind": "p2p_stall", "rank": 0, "step": 3},
                     parallelism={"pp": 2, "pp_microbatches": 2})
    job_id = submit(store, spec)
    terminal(store, job_id)
    d = report_of(store, job_id)
    _show("p2p_stall", d)
    assert d.verdict in ("P2P_MISMATCH", "NOT_JOINED")
    assert d.culprit_ranks == [0]


def test_user_hang_is_non_collective_with_the_stack(env) -> None:
    _, store = env
    job_id = submit(store, hang_spec("user", world=2,
                                     fault={"kind": "user_hang", "rank": 0, "step": 3}))
    terminal(store, job_id)
    d = report_of(store, job_id)
    _show("user_hang", d)
    assert (d.verdict, d.culprit_ranks) == ("NON_COLLECTIVE_HANG", [0, 1])
    assert "faults.py" in d.summary  # where every rank is blocked
    assert all("_block_forever" in (e.get("top_of_stack") or "") for e in d.report["evidence"])
    stacks = [Path(a) for a in d.report["artifacts"] if a.endswith("stacks.txt")]
    assert len(stacks) == 2
    for path in stacks:  # the whole training-thread stack, with the user function
        text = path.read_text()
        training = text[text.index("--- training"):]
        assert "_user_code_blocks_forever" in training and "run_training" in training


def test_slow_rank_is_a_straggler_not_a_hang(env) -> None:
    # A straggler lags by at least 30 % of the step time (which includes its own lag) and 3x
    # the others' spread and its own jitter: 1.5 s stands out of a loaded machine's noise
    # (0.3 s and 0.8 s did not once the suite's load made steps and their spread long).
    # A report needs two probes in a row to name the rank, a probe 8 steps per rank: 40 steps
    # leave room for four, so one probe spoilt by the host's load does not lose the report.
    # The stall threshold is far above the lag: with the module's 3 s, a 1.5 s lag stretched
    # past 3 s by the suite's load is a stall by the job's own setting (NOT_JOINED), which is
    # what the watchdog must say then; this scenario is about a rank that is slow, not stuck.
    _, store = env
    job_id = submit(store, hang_spec(
        "slow", action="observe", steps=40,
        fault={"kind": "slow", "rank": 2, "step": 2, "seconds": 1.5},
        watchdog={"stall_timeout_s": 30, "first_step_timeout_s": 120, "action": "observe"}))
    job = terminal(store, job_id)
    assert job.state == JobState.SUCCEEDED
    diags = store.list_diagnoses(job_id)
    assert diags, "no straggler report"
    _show("slow", diags[-1])
    assert {(d.verdict, tuple(d.culprit_ranks)) for d in diags} == {("STRAGGLER", (2,))}
    assert_probe_without_native(env[0].settings.data_dir / "runs" / job_id, world=3)



def test_healthy_job_has_no_report(env) -> None:
    _, store = env
    job_id = submit(store, hang_spec("healthy", action="observe", steps=30))
    job = terminal(store, job_id)
    assert job.state == JobState.SUCCEEDED
    assert store.list_diagnoses(job_id) == []


def test_restart_action_resumes_from_checkpoint(env) -> None:
    _, store = env
    spec = hang_spec("restart", action="restart", world=2,
                     fault={"kind": "hang", "rank": 0, "step": 4, "attempt": 1})
    spec["checkpoint"] = {"enabled": True, "every_steps": 2, "async_save": False}
    spec["fault_tolerance"] = dict(spec["fault_tolerance"], max_failures=1)
    job_id = submit(store, spec)
    job = terminal(store, job_id)
    assert job.state == JobState.SUCCEEDED, job.message
    attempts = store.list_attempts(job_id)
    assert [a.state for a in attempts] == ["FAILED", "SUCCEEDED"]
    assert attempts[0].failure_reason == "HANG_DETECTED"
    (d,) = store.list_diagnoses(job_id)
    assert (d.attempt, d.verdict, d.culprit_ranks) == (1, "NOT_JOINED", [0])
    logs = [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]
    assert any("resumed from checkpoint at step 2" in line for line in logs)


def test_a_checkpoint_save_longer_than_the_stall_threshold_is_not_a_hang(env) -> None:
    """Rank 0 spends 8 s in the save after step 2 (its peer waits inside the save's
    collectives), over twice the 3 s stall threshold: the save's own threshold applies, so
    the job runs on with no report."""
    _, store = env
    spec = hang_spec("slow-save", world=2, steps=4,
                     fault={"kind": "slow_save", "rank": 0, "step": 2, "seconds": 8})
    spec["checkpoint"] = {"enabled": True, "every_steps": 2, "async_save": False}
    job_id = submit(store, spec)
    job = terminal(store, job_id)
    assert job.state == JobState.SUCCEEDED, job.message
    assert [a.state for a in store.list_attempts(job_id)] == ["SUCCEEDED"]
    assert store.list_diagnoses(job_id) == []
    logs = [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]
    assert any("slow_save: rank 0 saves 8 s late after step 2" in line for line in logs), logs


def test_a_pool_without_user_code_keeps_no_prestarted_rank_process(env):
    """warm_pool_user_code off: the pooled actors hold torch but no rank process of their
    own (each would be another interpreter with torch imported)."""
    import psutil
    import ray

    rt, _ = env
    rt.wait_for_pool(timeout_s=300)
    pids = [a["Pid"] for a in ray._private.state.actors(actor_state_name="ALIVE").values()
            if "WorkerActor" in a["ActorClassName"]]
    assert len(pids) >= 3, pids
    children = [" ".join(c.cmdline()) for pid in pids
                for c in psutil.Process(pid).children(recursive=True)]
    assert not [c for c in children if "meshyard._prestart" in c], children
