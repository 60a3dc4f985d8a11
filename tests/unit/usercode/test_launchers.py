"""A launcher in `entrypoint.command` is refused at submit, naming meshyard as the launcher and
the spec line to write; a program that does not exist is named in the rank's error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.spec import SpecValidationError, parse_spec

REPO = Path(__file__).resolve().parents[3]


def _refusal(command: list[str]) -> str:
    with pytest.raises(SpecValidationError) as info:
        parse_spec({"name": "x", "parallelism": {"dp_replicate": 2},
                    "entrypoint": {"command": command}})
    issues = [(i.loc, i.msg) for i in info.value.issues]
    assert [loc for loc, _ in issues] == ["entrypoint.command"], issues
    return issues[0][1]


@pytest.mark.parametrize(("command", "name", "line", "ranks"), [
    (["torchrun", "--nproc_per_node=2", "train.py", "--steps", "20"], "torchrun",
     '[python, train.py, --steps, "20"]', "2"),
    (["/opt/venv/bin/torchrun", "--nnodes", "2", "--nproc-per-node", "4", "--standalone",
      "train.py"], "torchrun", "[python, train.py]", "8"),
    (["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py", "--lr=1e-3"],
     "python -m torch.distributed.run", "[python, t.py, --lr=1e-3]", "2"),
    (["python3", "-u", "-m", "torch.distributed.launch", "t.py"],
     "python -m torch.distributed.launch", "[python, t.py]", "N"),
    (["deepspeed", "--num_gpus", "8", "train.py", "--deepspeed", "--deepspeed_config", "ds.json"],
     "deepspeed", "[python, train.py, --deepspeed, --deepspeed_config, ds.json]", "8"),
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "4", "train.py"],
     "accelerate launch", "[python, train.py]", "4"),
    (["mpirun", "-np", "4", "python", "train.py"], "mpirun", "[python, train.py]", "4"),
    (["/usr/bin/mpiexec", "-n", "3", "./a.out"], "mpiexec", "[./a.out]", "3"),
    (["srun", "-N", "2", "--ntasks", "16", "-l", "python", "train.py"], "srun",
     "[python, train.py]", "16"),
])
def test_a_launcher_is_refused_with_the_line_to_write(command, name, line, ranks) -> None:
    msg = _refusal(command)
    assert f", {name} is a multi-process launcher" in msg, msg
    assert "meshyard is the launcher" in msg
    assert f"`entrypoint: {{command: {line}}}`" in msg, msg
    assert f"`parallelism: {{dp_replicate: {ranks}}}`" in msg, msg


@pytest.mark.parametrize("command", [
    ["python", "train.py"], ["python", "-m", "my.trainer"], ["bash", "run.sh"],
    ["python", "torchrun.py"], ["accelerate", "config"], ["./torchrun_wrapper"],
])
def test_programs_that_are_not_launchers_pass(command) -> None:
    spec = parse_spec({"name": "x", "entrypoint": {"command": command}})
    assert spec.entrypoint is not None and list(spec.entrypoint.command or ()) == command


@pytest.mark.parametrize(("program", "needle"), [
    ("no-such-program-xyz", "program 'no-such-program-xyz' not found on the rank's PATH"),
    ("./missing.sh", "program './missing.sh' not found in the working dir"),
])
def test_a_missing_program_is_named_in_the_error_record(tmp_path, program, needle) -> None:
    report = tmp_path / "reports.jsonl"
    env = {**os.environ, "MESHYARD_REPORT_FILE": str(report), "PYTHONPATH": str(REPO)}
    env.pop("MESHYARD_PROBE_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "meshyard.runner", "exec", program, "--x"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 1
    rec = json.loads(report.read_text().splitlines()[-1])
    assert rec["kind"] == "error" and rec["setup"] is True
    assert rec["type"] == "FileNotFoundError" and needle in rec["message"], rec
    assert needle in proc.stderr


def test_a_file_that_is_not_executable_is_named(tmp_path) -> None:
    (tmp_path / "run.sh").write_text("echo hi\n")
    report = tmp_path / "reports.jsonl"
    env = {**os.environ, "MESHYARD_REPORT_FILE": str(report), "PYTHONPATH": str(REPO)}
    env.pop("MESHYARD_PROBE_DIR", None)
    subprocess.run([sys.executable, "-m", "meshyard.runner", "exec", "./run.sh"], cwd=tmp_path,
                   env=env, capture_output=True, timeout=60, check=False)
    rec = json.loads(report.read_text().splitlines()[-1])
    assert rec["type"] == "PermissionError" and "'./run.sh' is not executable" in rec["message"]
