"""Helpers for the non-PP worker tests: torchrun launches of ``workers.loop.launch``, the in-process
single-process reference, spec variants and parity assertions."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "tiny"

# Losses agree to float32 reduction order: observed <= 1e-6 over 12 steps for DDP, ZeRO-1/2/3,
# HSDP, TP, FSDP+TP(+SP+AC). The bound is ~20x that and far below a real bug (a wrong gradient
# scale, a missing all-reduce or a wrong data shard moves the loss by >= 1e-3 within 2 steps).
LOSS_ATOL = 2e-5
GRAD_NORM_RTOL = 1e-4
# fp16 / bf16 gradient compression rounds every gradient: parity to a few 1e-3.
COMPRESSED_LOSS_ATOL = {"fp16": 2e-3, "bf16": 2e-2}


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def torchrun_cmd(*, nproc: int, specs: list[Path], out: Path, extra: list[str] = (),
                 log_dir: Path | None = None) -> list[str]:
    # --standalone: torchrun picks a free rendezvous port itself (no port race between tests).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "--monitor-interval=1"]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir), "--redirects", "3"]
    cmd += ["-m", "workers.loop.launch", "--out", str(out)]
    for s in specs:
        cmd += ["--spec", str(s)]
    return [*cmd, *extra]


def torchrun(*, nproc: int, specs: list[Path], out: Path, extra: list[str] = (),
             timeout: float = 240, log_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun_cmd(nproc=nproc, specs=specs, out=out, extra=extra,
                                       log_dir=log_dir),
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout,
                          check=False)


def forkrun(*, nproc: int, specs: list[Path], out: Path, extra: list[str] = (),
            timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """As `torchrun`, with the ranks forked from one process that imported torch once
    (forkrun.py): for launches where the training is under test, not the launcher."""
    from tests.integration.workers.forkrun import run_forked

    return run_forked(nproc=nproc, specs=specs, out=out, extra=list(extra), env=_env(),
                      cwd=REPO, timeout=timeout)


def popen_torchrun(*, nproc: int, specs: list[Path], out: Path, extra: list[str] = (),
                   log: Path) -> subprocess.Popen[bytes]:
    """Starts torchrun in its own session (so the test can kill exactly that group)."""
    with open(log, "wb") as fh:
        return subprocess.Popen(torchrun_cmd(nproc=nproc, specs=specs, out=out, extra=extra),
                                cwd=REPO, env=_env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kills torchrun and every rank it started. torchrun puts its workers in sessions of
    their own, so killing torchrun's process group alone leaves hung ranks running forever."""
    if proc.poll() is None:
        for pid in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def variant(base: str, tmp: Path, *, name: str, **changes: Any) -> Path:
    """Writes examples/tiny/<base>.yaml with top-level blocks updated (dicts merged, except
    a block with a ``kind`` — model / data — which replaces the old one)."""
    doc = yaml.safe_load((TINY / f"{base}.yaml").read_text())
    doc["name"] = name
    for key, val in changes.items():
        if isinstance(val, dict) and isinstance(doc.get(key), dict) and "kind" not in val:
            doc[key] = {**doc[key], **val}
        else:
            doc[key] = val
    path = tmp / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


class Collect:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_step(self, metrics: dict[str, Any]) -> None:
        self.steps.append(metrics)

    def on_heartbeat(self, hb: Any) -> None:
        pass

    def on_log(self, level: str, message: str) -> None:
        pass


def reference(spec_path: Path, *, steps: int | None = None) -> list[dict[str, Any]]:
    """The single-process baseline, run in the test process (no process group)."""
    from workers.loop.launch import load_spec
    from workers.loop.train import run_training

    spec = load_spec(spec_path)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(
        update={"enabled": False})})
    cb = Collect()
    import tempfile

    import torch

    # One intra-op thread, like the workers (OMP_NUM_THREADS=1): no oversubscription on a
    # shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as d:
            run_training(spec, out_dir=d, callbacks=cb, reference=True, steps=steps)
    finally:
        torch.set_num_threads(threads)
    return cb.steps


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if line.strip()]


def heartbeat(run: Path, rank: int) -> dict[str, Any]:
    return json.loads((run / "heartbeats" / f"rank_{rank}.json").read_text())


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-6000:]}"


def assert_parity(got: list[dict[str, Any]], want: list[dict[str, Any]], *,
                  loss_atol: float = LOSS_ATOL, grad_rtol: float | None = GRAD_NORM_RTOL,
                  min_steps: int = 10) -> None:
    assert len(got) >= min_steps, f"only {len(got)} steps"
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for g, w in zip(got, want, strict=True):
        assert abs(g["loss"] - w["loss"]) <= loss_atol, (g["step"], g["loss"], w["loss"])
        if grad_rtol is not None:
            assert abs(g["grad_norm"] - w["grad_norm"]) <= grad_rtol * w["grad_norm"], \
                (g["step"], g["grad_norm"], w["grad_norm"])
    # It trained: matching trajectories are not two constants.
    assert got[0]["loss"] - got[-1]["loss"] > 0.1
