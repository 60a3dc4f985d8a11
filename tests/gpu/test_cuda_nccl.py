"""CUDA / NCCL path: world size 1 under torchrun, each single-GPU strategy, NCCL_DEBUG file and
a Flight Recorder dump. Skipped without CUDA (run it on a GPU node or the device machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (no GPU here)")]

# At world size 1 only the degenerate degrees fit; these still run the NCCL process group,
# DDP wrapping and activation checkpointing on the GPU.
SPECS = {
    "ddp": {},
    "ddp-ac": {"activation_checkpointing": True},
}


def _spec(tmp: Path, name: str, extra: dict[str, object]) -> Path:
    import yaml

    doc = {"name": f"gpu-{name}", "resources": {"device": "cuda"},
           "parallelism": dict(extra),
           "model": {"n_layers": 2, "n_heads": 4, "d_model": 128, "seq_len": 128},
           "training": {"steps": 5, "micro_batch_size": 4},
           "checkpoint": {"enabled": False},
           "debug": {"nccl_debug": "INFO", "flight_recorder_entries": 2000}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("name", sorted(SPECS))
def test_single_gpu_strategy_trains_with_nccl(tmp_path: Path, name: str) -> None:
    spec = _spec(tmp_path, name, SPECS[name])
    out = tmp_path / "run"
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
         "-m", "workers.loop.launch", "--spec", str(spec), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["loss"] == r["loss"] for r in rows)  # no NaN
    nccl_logs = list((out / "nccl").glob("*.log"))
    assert nccl_logs and any("NCCL INFO" in p.read_text() for p in nccl_logs)
