"""Helpers for the pipeline tests: run ``workers.loop.launch`` under torchrun / as the reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from workers.host.env import free_port

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "tiny"
FIXTURES = REPO / "tests" / "fixtures" / "workers"

# Losses agree to float32 reduction order (observed <= 2e-6 over 12 steps); the bound leaves
# room for other BLAS thread counts, and is far below a real bug (a wrong gradient scale or a
# missing stage in the grad-norm moves the loss by 1e-3 or more within a few steps).
LOSS_ATOL = 2e-5
GRAD_NORM_RTOL = 1e-4


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def torchrun(*, nproc: int, specs: list[Path], out: Path, steps: int | None = None,
             extra: list[str] = (), timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "workers.loop.launch",
           "--out", str(out)]
    for s in specs:
        cmd += ["--spec", str(s)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    return subprocess.run([*cmd, *extra], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def forkrun(*, nproc: int, specs: list[Path], out: Path, steps: int | None = None,
            extra: list[str] = (), timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """As `torchrun`, with the ranks forked from one process that imported torch once
    (forkrun.py)."""
    from tests.integration.workers.forkrun import run_forked

    steps_args = [] if steps is None else ["--steps", str(steps)]
    return run_forked(nproc=nproc, specs=specs, out=out, extra=[*steps_args, *extra],
                      env=_env(), cwd=REPO, timeout=timeout)


def reference(*, specs: list[Path], out: Path, steps: int | None = None,
              timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "workers.loop.launch", "--reference", "--out", str(out)]
    for s in specs:
        cmd += ["--spec", str(s)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_dir(out: Path, spec: Path, *, n_specs: int) -> Path:
    return out / spec.stem if n_specs > 1 else out


def metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()
            if line.strip()]


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-6000:]}"


def assert_parity(dist_dir: Path, ref_dir: Path, *, min_steps: int = 10) -> None:
    got, want = metrics(dist_dir), metrics(ref_dir)
    assert len(got) >= min_steps
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for g, w in zip(got, want, strict=True):
        assert abs(g["loss"] - w["loss"]) <= LOSS_ATOL, (g["step"], g["loss"], w["loss"])
        assert abs(g["grad_norm"] - w["grad_norm"]) <= GRAD_NORM_RTOL * w["grad_norm"], \
            (g["step"], g["grad_norm"], w["grad_norm"])
    # The run trained (the loss moved), so matching trajectories are not two constants.
    assert abs(got[-1]["loss"] - got[0]["loss"]) > 1e-3


def runner_used(run: Path, rank: int) -> str:
    return (run / "logs" / f"rank_{rank}.log").read_text()
