"""User code through the whole runtime on the package's simulated cluster: an uploaded script
whose working dir has its own `api` / `workers` / `orchestrator` packages, ranks placed on fake
GPUs with torchrun's variables; a function that crashes on attempt 1 and resumes from its
reported checkpoint on attempt 2; cancel that leaves no process behind; a function that does
not import and a program that does not exist (failed at once, naming it, not restarted).

The module's jobs keep their checkpoints on the cluster's checkpoint storage (a folder here
beside the run dirs), where the confined ranks write only their own job's folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.settings import Settings
from tests.integration.runtime.conftest import package_settings, submit, wait_for, wait_state
from tests.integration.runtime.usercode_helpers import (
    USER_CODE,
    alive,
    rank_json,
    ship,
    user_spec,
    wait_files,
)


@pytest.fixture()
def settings(tmp_path: Path, ray_cluster) -> Settings:
    storage = tmp_path / "checkpoint-storage"
    storage.mkdir()
    (storage / "job-someone-else").mkdir()  # another job's folder: hidden from these ranks
    return package_settings(tmp_path, ray_cluster, checkpoint_storage=storage)


def test_script_with_own_api_workers_orchestrator_runs_on_fake_gpus(runtime, store, settings):
    ref = ship(settings, USER_CODE / "shadow")
    job_id = submit(store, user_spec(
        "shadow", {"command": ["python", "train.py", "--flag"], "working_dir": ref,
                   "env": {"MY_SETTING": "on"}},
        parallelism={"tp": 2, "dp_replicate": 2}, resources={"cpus_per_worker": 0.25}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    run = settings.resolved_runs_dir / job_id
    ranks = store.list_ranks(job_id)
    assert [r.rank for r in ranks] == [0, 1, 2, 3] and all(r.gpu is not None for r in ranks)
    by_node: dict[str, list] = {}
    for r in ranks:
        by_node.setdefault(r.node_id, []).append(r)
    node_order = list(dict.fromkeys(r.node_id for r in ranks))
    for r in ranks:
        got = rank_json(run, r.rank)
        env = got["env"]
        peers = by_node[r.node_id]
        assert env["RANK"] == str(r.rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(peers.index(r)) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(node_order.index(r.node_id))
        assert env["ROLE_RANK"] == str(r.rank) and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == job_id and env["MESHYARD_ATTEMPT"] == "1"
        # The job's GPUs on this node, in local-rank order: cuda:LOCAL_RANK is this rank's.
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(p.gpu) for p in peers)
        assert env["MESHYARD_MESH_DIM_NAMES"] == "pp,dp_replicate,dp_shard,ep,cp,tp"
        assert env["MESHYARD_MESH_SHAPE"] == "1,2,1,1,1,2"
        assert env["MESHYARD_CHECKPOINT_DIR"] == str(settings.checkpoint_storage.resolve()
                                                     / job_id)
        assert env["MY_SETTING"] == "on" and "MESHYARD_ADMIN_TOKEN" not in env
        assert got["argv"][1:] == ["--flag"] and got["sum"] == 10.0
        assert got["cwd"].endswith("/meshyard-code")
        assert all(f.startswith(got["cwd"]) for f in got["modules"].values())
        assert r.pid == got["pid"]  # the rank row names the rank process
    assert [(m.rank, m.step) for m in store.list_metrics(job_id)] == [
        (r, s) for s in (1, 2, 3) for r in range(4)]
    assert store.get_job(job_id).last_loss == pytest.approx(1 / 3)
    lines = [x.line for x in store.list_logs(job_id, rank=3, limit=1000)]
    assert "rank 3 done, all_reduce sum 10" in lines
    assert (run / "logs" / "attempt-1" / "rank-3.stdout").read_text().count("rank 3 done") == 1


def test_function_crash_resumes_from_reported_checkpoint(runtime, store, settings):
    ref = ship(settings, USER_CODE / "resume")
    job_id = submit(store, user_spec(
        "resume", {"function": "train:loop", "config": {"steps": 6, "crash_at": 4},
                   "working_dir": ref},
        # The exit is the script's own (status 3, no exception): restarted because retry_on
        # names it; without it the job would fail at once as USER_ERROR.
        fault_tolerance={"max_failures": 1, "init_timeout_s": 60, "collective_timeout_s": 30,
                         "retry_on": {"exit_codes": [3]}}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    attempts = store.list_attempts(job_id)
    assert [a.state for a in attempts] == ["FAILED", "SUCCEEDED"]
    assert attempts[0].message.startswith("the rank process exited with code 3 (rank 1 on "), \
        attempts[0].message
    points = [(m.attempt, m.step, m.loss) for m in store.list_metrics(job_id, rank=0)]
    # No gap, no duplicate: attempt 2 resumes after the last step every rank reported.
    assert [(a, s) for a, s, _ in points] == [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (2, 6)]
    assert [loss for _, _, loss in points] == [s * (s + 1) for s in range(1, 7)]
    logs = [x.line for x in store.list_logs(job_id, rank=0, limit=5000)]
    assert "rank 0 resumed from step 3" in logs
    # Every complete reported checkpoint is in the job's list (what the API and the dashboard
    # show): steps 1-3 of attempt 1, 4-6 of attempt 2, each with its files' size.
    listed = store.list_checkpoints(job_id)
    assert [(c.attempt, c.step) for c in listed] == [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (2, 6)]
    run = settings.checkpoint_storage.resolve() / job_id  # on the storage, not the run dir
    assert not (settings.resolved_runs_dir / job_id / "checkpoints").exists()
    for c in listed:
        assert Path(c.path) == run / f"step_{c.step:08d}" and not c.removed
        assert c.size_bytes == (Path(c.path) / "state.pt").stat().st_size + \
            (Path(c.path) / "COMPLETE").stat().st_size


def test_cancel_leaves_no_process_of_the_script(runtime, store, settings):
    ref = ship(settings, USER_CODE / "sleepy")
    job_id = submit(store, user_spec("sleepy", {"command": ["python", "train.py"],
                                                "working_dir": ref}))
    run = settings.resolved_runs_dir / job_id
    wait_files([run / "pids-rank0", run / "pids-rank1"])
    wait_state(store, job_id, JobState.RUNNING, timeout_s=60)
    pids = [int(p) for r in (0, 1) for p in (run / f"pids-rank{r}").read_text().split()]
    assert all(alive(p) for p in pids)
    store.request_cancel(job_id, viewer=None)
    wait_state(store, job_id, JobState.CANCELLED, timeout_s=60)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if alive(p)] == []


def test_function_that_does_not_import_fails_at_once_with_the_error(runtime, store, settings):
    ref = ship(settings, USER_CODE / "resume")
    job_id = submit(store, user_spec(
        "typo", {"function": "trian:loop", "working_dir": ref},
        fault_tolerance={"max_failures": 3, "init_timeout_s": 60, "collective_timeout_s": 30}))
    job = wait_state(store, job_id, JobState.FAILED, JobState.SUCCEEDED, timeout_s=120)
    assert job.state == JobState.FAILED and job.failure_reason == "SETUP_ERROR"
    assert len(store.list_attempts(job_id)) == 1  # not restarted: it would fail the same way
    assert "ModuleNotFoundError" in job.message and "No module named 'trian'" in job.message
    err = [e for e in store.list_events(job_id) if e.kind == "error"][-1]
    # One failure, grouped: each rank fails the same way, but a rank whose process has not
    # reached the import when the other's error ends the attempt (a loaded host starts cold
    # rank processes seconds apart) is stopped instead and is not in the group.
    (group,) = err.data["groups"]
    assert group["ranks"] in ([0], [1], [0, 1]), group
    assert "ModuleNotFoundError" in group["signature"] + group["message"]
    wait_for(store, job_id, lambda j: j.state.terminal)


def test_a_program_that_does_not_exist_is_named_in_the_failure(runtime, store, settings):
    ref = ship(settings, USER_CODE / "resume")
    job_id = submit(store, user_spec(
        "noprog", {"command": ["no-such-launcher", "train.py"], "working_dir": ref},
        fault_tolerance={"max_failures": 3, "init_timeout_s": 60, "collective_timeout_s": 30}))
    job = wait_state(store, job_id, JobState.FAILED, JobState.SUCCEEDED, timeout_s=120)
    assert job.state == JobState.FAILED and job.failure_reason == "SETUP_ERROR", job.message
    assert len(store.list_attempts(job_id)) == 1
    assert "FileNotFoundError" in job.message, job.message
    assert "program 'no-such-launcher' not found on the rank's PATH" in job.message, job.message


def test_missing_working_dir_path_fails_before_any_code_runs(runtime, store, settings):
    job_id = submit(store, user_spec("nodir", {"command": ["python", "train.py"],
                                               "working_dir": str(Path("/nonexistent/code"))}))
    job = wait_state(store, job_id, JobState.FAILED, JobState.SUCCEEDED, timeout_s=120)
    assert job.failure_reason == "SETUP_ERROR" and "does not exist" in job.message
    assert len(store.list_attempts(job_id)) == 1
