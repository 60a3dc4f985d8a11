"""The examples in examples/byo/ as meshyard jobs: the plain DDP script gives the same losses
under torchrun and under meshyard (parity); the Ray Train port reports metrics and
checkpoints through meshyard.train; the FSDP2 + TP script builds its mesh from
MESHYARD_MESH_*."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.lifecycle import JobState
from tests.integration.runtime.conftest import submit, wait_state
from tests.integration.runtime.usercode_helpers import EXAMPLES, ship, user_spec
from workers.host.env import free_port

LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)")


def _losses(lines: list[str]) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for line in lines if (m := LOSS.match(line))}


def _torchrun(script_dir: Path, *args: str, tmp: Path) -> list[str]:
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHYARD_")}
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run([str(torchrun), "--nnodes=1", "--nproc_per_node=2",
                          f"--master_port={free_port()}", "train.py", *args],
                         cwd=script_dir, env=env, capture_output=True, text=True, timeout=240,
                         check=True)
    (tmp / "torchrun.log").write_text(out.stdout + out.stderr)
    return out.stdout.splitlines()


@pytest.mark.slow
def test_plain_ddp_script_same_losses_under_torchrun_and_meshyard(runtime, store, settings,
                                                                  tmp_path):
    script = EXAMPLES / "ddp"
    expected = _losses(_torchrun(script, "--steps", "6", tmp=tmp_path))
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]
    job_id = submit(store, user_spec("parity", {
        "command": ["python", "train.py", "--steps", "6"], "working_dir": ship(settings, script),
        "env": {"OMP_NUM_THREADS": "1"}}))
    job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
    assert job.state == JobState.SUCCEEDED, job.message
    got = _losses([x.line for x in store.list_logs(job_id, rank=0, limit=5000)])
    assert got == pytest.approx(expected, rel=1e-6)
    assert store.list_metrics(job_id) == []  # it never imports meshyard: logs, no metrics


@pytest.mark.slow
def test_ray_train_port_and_fsdp_tp_script_train_as_meshyard_jobs(runtime, store, settings):
    rt = submit(store, user_spec("raytrain", {
        "function": "train:train_func", "config": {"lr": 0.001, "epochs": 3, "batch_size": 64},
        "working_dir": ship(settings, EXAMPLES / "raytrain")}))
    tp = submit(store, user_spec("fsdp-tp", {
        "command": ["python", "train.py", "--steps", "4"],
        "working_dir": ship(settings, EXAMPLES / "fsdp_tp")},
        parallelism={"dp_shard": 2, "tp": 2}))
    for job_id in (rt, tp):
        job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=300)
        assert job.state == JobState.SUCCEEDED, job.message
    # Ray Train port: one report per epoch on both ranks, counted (no `step` key), each
    # epoch's checkpoint complete once both ranks reported it.
    assert [(m.rank, m.step) for m in store.list_metrics(rt)] == [
        (r, s) for s in (1, 2, 3) for r in (0, 1)]
    ckpts = settings.resolved_runs_dir / rt / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*/COMPLETE")) == ["COMPLETE"] * 3
    assert (ckpts / "step_00000003" / "model.pt").is_file()
    # FSDP + TP: the mesh the script built is the job's.
    lines = [x.line for x in store.list_logs(tp, rank=0, limit=5000)]
    assert any("mesh {'pp': 1, 'dp_replicate': 1, 'dp_shard': 2, 'ep': 1, 'cp': 1, 'tp': 2}" in x
               for x in lines), [x for x in lines if 'mesh' in x]
    assert [m.step for m in store.list_metrics(tp, rank=3)] == [1, 2, 3, 4]
