"""A user script that crashes on one rank, on the simulated cluster: the diagnosis and the
job's message name exactly the rank that raised, with its own error text as written (numbers
and file names kept, the job's secret env value masked) and the line that raised; the peers
that lost it are folded into one "lost a peer" clause and are not culprits. The user's own
error fails the job at once (USER_ERROR) and counts against no node; `retry_on` naming it
restarts it like any other failure, still naming no node."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import AttemptState, JobState
from orchestrator.nodes.health_policy import NodeState
from orchestrator.runtime.policy import AttemptFailure
from tests.integration.runtime.conftest import submit, wait_for, wait_state
from tests.integration.runtime.usercode_helpers import FT, USER_CODE, ship, ship_own, user_spec

SECRET = "hunter2-s3cr3t-value"
RAISE_LINE = next(i for i, line in enumerate(
    (USER_CODE / "crashy" / "train.py").read_text().splitlines(), 1) if "raise ValueError" in line)


def test_crashed_script_names_the_rank_that_raised(runtime, store, settings, tmp_path):
    ref = ship(settings, USER_CODE / "crashy")
    entry = {"command": ["python", "train.py"], "working_dir": ref,
             "env": {"CRASH_RANK": "1", "CRASH_STEP": "3", "DATA_KEY": SECRET}}
    job_id = submit(store, user_spec("crashy", entry, parallelism={"dp_replicate": 3}))
    own = ship_own(settings, USER_CODE / "crashy", scratch=tmp_path, tag="retried")
    retried = submit(store, user_spec(
        "crashy-retried", {**entry, "working_dir": own,
                           "env": {**entry["env"], "CRASH_RANK": "0"}},
        parallelism={"dp_replicate": 2},
        fault_tolerance={**FT, "max_failures": 1, "retry_on": {"exceptions": ["ValueError"]}}))
    job = wait_state(store, job_id, JobState.FAILED, JobState.SUCCEEDED, timeout_s=240)
    assert job.state == JobState.FAILED, job.message
    assert job.failure_reason == "USER_ERROR", job.message
    text = "corrupt record in shard-00017.bin at step 3 (key ***, code 4242)"
    expected = f"ValueError: {text}"
    assert job.message.startswith(f"ValueError at train.py:{RAISE_LINE} in <module>: {text} "
                                  "(rank 1 on c1)"), job.message
    assert "then 2 ranks (0,2) on c1 lost a peer" in job.message, job.message
    assert "not restarted" in job.message and "retry_on" in job.message
    assert [a.state for a in store.list_attempts(job_id)] == [AttemptState.FAILED]
    assert SECRET not in job.message and "<N>" not in job.message

    diags = store.list_diagnoses(job_id)
    assert [(d.verdict, d.culprit_ranks) for d in diags] == [("RANK_EXITED", [1])]
    summary = diags[0].summary
    assert summary.startswith("Rank 1 (c1, dp_replicate 1) exited "
                              f"({expected}); ranks 0, 2 lost it"), summary
    assert summary.count("Connection closed by peer") <= 1 and SECRET not in summary
    # the rank table: the rank that raised failed, the two that lost it are "peer lost"
    assert {r.rank: r.state for r in store.list_ranks(job_id)} == {
        0: "PEER_LOST", 1: "FAILED", 2: "PEER_LOST"}

    err = [e for e in store.list_events(job_id) if e.kind == "error"][-1]
    groups = err.data["groups"]
    assert [(g["ranks"], g.get("peer_lost", False)) for g in groups] == [
        ([1], False), ([0, 2], True)]
    assert groups[0]["message"] == expected
    assert SECRET not in str(err.data)
    assert AttemptFailure.from_event_data(err.data).failed_nodes == ()  # no node blamed
    assert err.data["blame"] == "user"

    # retry_on names ValueError: restarted once (max_failures 1), then MAX_FAILURES; the
    # node it failed on twice is still not blamed, and stays healthy.
    job = wait_state(store, retried, JobState.FAILED, JobState.SUCCEEDED, timeout_s=300)
    assert job.failure_reason == "MAX_FAILURES", job.message
    assert [a.state for a in store.list_attempts(retried)] == [AttemptState.FAILED] * 2
    fails = [AttemptFailure.from_event_data(e.data) for e in store.list_events(retried)
             if e.kind == "error" and "attempt" in e.data]
    assert len(fails) == 2 and all(f.failed_nodes == () for f in fails)
    assert f"ValueError at train.py:{RAISE_LINE}" in job.message
    assert [h.node for h in store.list_node_health() if h.state != NodeState.HEALTHY] == []
    wait_for(store, job_id, lambda j: j.state.terminal)


def test_script_that_reports_nothing_progresses_by_its_collectives(runtime, store, settings):
    """A script that reports no step: its ranks' rows count the collectives its probe saw,
    its status says it reports no steps (not "step 0 of 0"), and the goodput ledger books
    the time after its first collective as productive, not as starting."""
    from api.store_views import job_goodput

    ref = ship(settings, USER_CODE / "crashy")
    job_id = submit(store, user_spec("quiet", {
        "command": ["python", "train.py"], "working_dir": ref,
        "env": {"CRASH_RANK": "-1", "STEPS": "120"}}, parallelism={"dp_replicate": 2}))
    running = wait_for(store, job_id, lambda j: j.state.terminal or any(
        (r.collectives or 0) > 0 for r in store.list_ranks(j.id)), timeout_s=240)
    if running.state == JobState.RUNNING:
        assert running.status.startswith("running: the script reports no steps"), running.status
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    ranks = store.list_ranks(job_id)
    assert [r.rank for r in ranks] == [0, 1]
    for r in ranks:  # 119 all_reduces each; the last sample may come a little before the end
        assert r.collectives is not None and 0 < r.collectives <= 119 + 2, r
        assert r.progress_first_at is not None and r.progress_at >= r.progress_first_at
    g = job_goodput(job, store)
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s)
    assert g.seconds["productive"] > 0 and g.seconds["hung"] == 0, g.to_dict()
    first = ranks[0].progress_first_at.timestamp()
    starting = [s for s in g.segments if s.kind == "starting"]
    assert starting and starting[-1].end == pytest.approx(first), g.to_dict()
