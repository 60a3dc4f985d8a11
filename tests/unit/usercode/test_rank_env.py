"""What a user-code rank process gets: its argv (always through meshyard.runner) and its
torchrun-compatible environment; report records -> metrics rows; when a reported checkpoint
is complete; how rank exits are grouped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshyard import _protocol as proto
from orchestrator.lifecycle import Reason
from orchestrator.runtime.failures import RankFailure, group_failures, summarise
from orchestrator.runtime.policy import Outcome, restart_decision
from orchestrator.runtime.user_checkpoints import ReportedCheckpoints, write_marker
from orchestrator.spec import parse_spec
from orchestrator.usercode.entrypoint import Entrypoint
from workers.host.assignment import DistEnv, RankAssignment
from workers.usercode.environment import rank_argv, rank_env
from workers.usercode.rank import metric_row

PY = "/venv/bin/python"


@pytest.mark.parametrize("command,argv", [
    (["python", "train.py", "--lr", "1"], [PY, "-m", "meshyard.runner", "script", "train.py",
                                           "--lr", "1"]),
    (["python3", "-u", "-W", "ignore", "t.py"], [PY, "-u", "-W", "ignore", "-m",
                                                 "meshyard.runner", "script", "t.py"]),
    (["python", "-m", "pkg.train", "x"], [PY, "-m", "meshyard.runner", "module", "pkg.train",
                                          "x"]),
    (["python", "-c", "print(1)", "a"], [PY, "-m", "meshyard.runner", "code", "print(1)", "a"]),
    (["bash", "run.sh"], [PY, "-m", "meshyard.runner", "exec", "bash", "run.sh"]),
    (["python", "-Q", "t.py"], [PY, "-m", "meshyard.runner", "exec", PY, "-Q", "t.py"]),
    ([PY, "t.py"], [PY, "-m", "meshyard.runner", "script", "t.py"]),
])
def test_every_rank_starts_through_the_runner(command, argv) -> None:
    assert rank_argv(Entrypoint(command=tuple(command)), python=PY) == argv


def test_function_entrypoints_run_in_the_runner() -> None:
    assert rank_argv(Entrypoint(function="train:loop"), python=PY) == [
        PY, "-m", "meshyard.runner", "function", "train:loop"]


def _assignment(rank: int, *, local: int, gpus: tuple[int, ...], node_rank: int) -> RankAssignment:
    spec = parse_spec({"name": "x", "parallelism": {"tp": 2, "dp_shard": 2},
                       "fault_tolerance": {"max_failures": 2},
                       "entrypoint": {"command": ["python", "t.py"],
                                      "env": {"WANDB_MODE": "offline", "PYTHONPATH": "/extra"}}})
    return RankAssignment(job_id="job-1", attempt=2, rank=rank, spec=spec, run_dir="/runs/job-1",
                          log_dir="/runs/job-1/logs/attempt-2", node_rank=node_rank, num_nodes=2,
                          local_gpus=gpus,
                          dist=DistEnv(rank=rank, local_rank=local, world_size=4,
                                       local_world_size=2, master_addr="10.0.0.1",
                                       master_port=29501))


def test_rank_env_is_torchrun_compatible_plus_meshyards_own() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/ray/wd:/site", "MESHYARD_ADMIN_TOKEN": "secret",
            "DATABASE_URL": "postgresql://u:pw@h/db", "CUDA_VISIBLE_DEVICES": "5"}
    env = rank_env(_assignment(3, local=1, gpus=(6, 5), node_rank=1), base=base,
                   code_dir="/ray/wd/meshyard-code", report_file="/r.jsonl",
                   debug={"NCCL_DEBUG": "WARN"}, parent_pid=77, runtime_root="/ray/wd")
    expect = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
              "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3",
              "ROLE_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29501",
              "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "2",
              "TORCHELASTIC_RUN_ID": "job-1", "CUDA_VISIBLE_DEVICES": "6,5",
              "MESHYARD_JOB_ID": "job-1", "MESHYARD_ATTEMPT": "2",
              "MESHYARD_MESH_DIM_NAMES": "pp,dp_replicate,dp_shard,ep,cp,tp",
              "MESHYARD_MESH_SHAPE": "1,1,2,1,1,2", "MESHYARD_ZERO_STAGE": "3",
              "MESHYARD_CHECKPOINT_DIR": "/runs/job-1/checkpoints",
              proto.REPORT_FILE: "/r.jsonl", proto.PARENT_PID: "77",
              "NCCL_DEBUG": "WARN", "WANDB_MODE": "offline", "PATH": "/bin"}
    assert {k: env.get(k) for k in expect} == expect
    # the code first, then the user's entries, then the cluster's; Ray's runtime-env root
    # (which only holds the code folder) dropped
    assert env["PYTHONPATH"] == "/ray/wd/meshyard-code:/extra:/site"
    assert "MESHYARD_ADMIN_TOKEN" not in env and "DATABASE_URL" not in env


def test_the_checkpoint_dir_is_on_the_storage_or_refused_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from meshyard.train import Checkpoint, _report
    from meshyard.train import report as train_report

    base = _assignment(0, local=0, gpus=(), node_rank=0)
    shared = replace(base, checkpoint_dir=str(tmp_path / "storage" / "job-1"))
    env = rank_env(shared, base={}, code_dir="/c", report_file="/r", debug={}, parent_pid=1)
    assert env[proto.CHECKPOINT_DIR] == str(tmp_path / "storage" / "job-1")
    assert proto.CHECKPOINT_REFUSED not in env
    why = "the ranks landed on 2 hosts (10.0.0.1, 10.0.0.2) and checkpoints would go to ..."
    refused = replace(base, checkpoints_refused=why)
    env = rank_env(refused, base={}, code_dir="/c", report_file="/r", debug={}, parent_pid=1)
    assert env[proto.CHECKPOINT_REFUSED] == why and proto.CHECKPOINT_DIR not in env
    # in the rank: metrics report as usual; a checkpoint raises the reason
    reports = tmp_path / "reports.jsonl"
    monkeypatch.setenv(proto.REPORT_FILE, str(reports))
    monkeypatch.setenv(proto.CHECKPOINT_REFUSED, why)
    monkeypatch.delenv(proto.CHECKPOINT_DIR, raising=False)
    _report._STATE.clear()
    try:
        train_report({"loss": 1.0, "step": 1})
        (tmp_path / "ckpt").mkdir()
        with pytest.raises(RuntimeError, match="meshyard cannot keep this checkpoint: the "
                                               "ranks landed on 2 hosts"):
            train_report({"loss": 0.5, "step": 2},
                         checkpoint=Checkpoint.from_directory(str(tmp_path / "ckpt")))
    finally:
        _report._STATE.clear()
    assert [json.loads(x)["step"] for x in reports.read_text().splitlines()] == [1]


def test_cpu_ranks_get_no_cuda_visible_devices_from_meshyard() -> None:
    env = rank_env(_assignment(0, local=0, gpus=(), node_rank=0), base={}, code_dir="/c",
                   report_file="/r", debug={}, parent_pid=1)
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_report_records_become_metric_rows() -> None:
    rec = {"kind": "report", "step": 3, "time": 5.0, "checkpoint": "step_00000003",
           "metrics": {"loss": 0.5, "acc": 0.9, "tags": [1, 2], "step": 3}}
    assert metric_row(rec, rank=1) == {"loss": 0.5, "acc": 0.9, "step": 3, "rank": 1,
                                       "time": 5.0, "checkpoint": "step_00000003"}
    for bad in (None, -1, 10**12, "3", True, 2.5):
        assert metric_row({**rec, "step": bad}, rank=1) is None


def test_a_checkpoint_is_complete_once_every_rank_reported_its_step(tmp_path: Path) -> None:
    t = ReportedCheckpoints(root=tmp_path, world_size=2, attempt=1)
    assert t.observe([{"rank": 0, "step": 1, "checkpoint": "step_00000001"}]) == []
    assert t.observe([{"rank": 1, "step": 2}]) == []  # no rank saved files for step 2
    assert t.observe([{"rank": 1, "step": 1}]) == [1]
    assert t.observe([{"rank": 0, "step": 2}]) == []
    info = json.loads((tmp_path / "step_00000001" / proto.MARKER).read_text())
    assert info == {"step": 1, "attempt": 1, "ranks": 2}
    assert proto.complete_checkpoints(tmp_path) == [(1, tmp_path / "step_00000001")]
    write_marker(tmp_path / "step_00000004", {"step": 4})
    (tmp_path / "step_00000009").mkdir()  # files but no marker: never resumed from
    assert [s for s, _ in proto.complete_checkpoints(tmp_path)] == [1, 4]


def test_a_completed_checkpoint_is_described_with_its_size_links_not_followed(
        tmp_path: Path) -> None:
    t = ReportedCheckpoints(root=tmp_path, world_size=1, attempt=2)
    step = tmp_path / "step_00000003"
    (step / "sub").mkdir(parents=True)
    (step / "model.pt").write_bytes(b"x" * 1000)
    (step / "sub" / "opt.pt").write_bytes(b"y" * 24)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(b"z" * 10**6)
    (step / "link").symlink_to(outside)
    assert t.observe([{"rank": 0, "step": 3, "checkpoint": "step_00000003"}]) == [3]
    info = t.saved_info(3)
    marker = (step / proto.MARKER).stat().st_size
    assert info["step"] == 3 and info["path"] == str(step)
    assert info["size_bytes"] == 1024 + marker
    (tmp_path / "step_00000004").symlink_to(step)
    assert t.saved_info(4)["size_bytes"] is None


def test_rank_exits_are_grouped_with_their_exit_codes() -> None:
    groups = group_failures([
        RankFailure(rank=1, error_type="ExitCode", message="the rank process exited",
                    node="n1", exit_code=3),
        RankFailure(rank=0, error_type="RuntimeError", message="Connection closed by peer",
                    node="n1", exit_code=1),
        RankFailure(rank=2, error_type="RuntimeError", message="Connection closed by peer",
                    node="n2", exit_code=1)])
    assert summarise(groups) == ("rank 1 on n1: ExitCode: the rank process exited (exit code "
                                 "3); then 2 ranks (0,2) on 2 nodes lost a peer (RuntimeError: "
                                 "Connection closed by peer)")
    assert [g.to_dict().get("exit_codes") for g in groups] == [{"1": 3}, {"0": 1, "2": 1}]
    assert groups[1].to_dict()["exit_codes"] == {"0": 1, "2": 1}


def test_code_that_cannot_load_is_not_restarted() -> None:
    d = restart_decision(attempt=1, failed=1, max_failures=3, reason=Reason.SETUP_ERROR,
                         message="ModuleNotFoundError: No module named 'trian'")
    assert d.outcome == Outcome.FAIL
    assert restart_decision(attempt=1, failed=1, max_failures=3, reason=Reason.WORKER_CRASH,
                            message="x").outcome == Outcome.RESTART
