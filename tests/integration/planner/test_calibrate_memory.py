"""The planner's memory estimate against the workers' real CPU runs.

Two checks:
- exact: for the tiny example models and a GPT-2-size config, the parameter count of the
  built model and the bytes of parameters, gradients and AdamW states after one real step
  equal the estimate's params / grads / optimizer entries (fp32: 4 + 4 + 8 bytes);
- measured: a real `workers.loop.launch --reference` run of a GPT-2-size model (12 x 768, vocab
  50257, seq 128, batch 2, 2 steps) in a subprocess; its peak RSS above the RSS it had with
  torch and the workers imported (before building the model) is within 15% of the estimate.
  RSS is what the OS gave the process, so the allocator's caching shows up too: it is the
  honest CPU figure (torch.cuda.max_memory_allocated has no CPU twin).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.planner.memory import MemoryConfig, ModelShape, memory_per_gpu
from orchestrator.spec import parse_spec
from workers.loop.launch import load_spec
from workers.loop.model import build_model, loss_fn

ROOT = Path(__file__).resolve().parents[3]
TINY = sorted((ROOT / "examples" / "tiny").glob("*.yaml"))
GPT2 = {"name": "gpt2-mem", "resources": {"device": "cpu"}, "checkpoint": {"enabled": False},
        "model": {"kind": "gpt", "n_layers": 12, "n_heads": 12, "d_model": 768,
                  "vocab_size": 50257, "seq_len": 128},
        "training": {"steps": 2, "micro_batch_size": 2, "grad_accum_steps": 1, "lr": 3e-4}}

MEASURE = r"""
import json, resource, sys
import torch, torch.distributed  # noqa: F401
import workers.loop.launch, workers.loop.train, workers.loop.runner, workers.loop.model  # noqa: F401
def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
base = rss_kb()
rc = workers.loop.launch.main(["--spec", sys.argv[1], "--out", sys.argv[2], "--reference"])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rc": rc, "base_kb": base, "peak_kb": peak}))
"""


def _state_bytes(spec_data: dict) -> tuple[int, int, int, int]:
    spec = parse_spec(spec_data)
    model = build_model(spec, seed=0).module
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, spec.model.vocab_size, (1, 8))
    loss_fn(model(tokens), tokens).backward()
    opt.step()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    pb = sum(p.numel() * p.element_size() for p in params)
    gb = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    ob = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
             if torch.is_tensor(t) and t.dim() > 0)  # the 0-dim `step` counters are noise
    return n, pb, gb, ob


@pytest.mark.parametrize("path", TINY, ids=[p.stem for p in TINY])
def test_state_bytes_exact_for_tiny_examples(path: Path) -> None:
    spec = load_spec(path)
    assert spec.model.kind == "gpt", "the memory model covers the built-in GPT only"
    data = {"name": "x", "model": spec.model.model_dump(), "resources": {"device": "cpu"}}
    n, pb, gb, ob = _state_bytes(data)
    est = memory_per_gpu(ModelShape.from_gpt(spec.model), MemoryConfig(precision="fp32"))
    assert ModelShape.from_gpt(spec.model).total_params == n
    assert (est.params, est.grads, est.optimizer) == (pb, gb, ob)


def test_state_bytes_exact_for_gpt2_size() -> None:
    n, pb, gb, ob = _state_bytes(GPT2)
    shape = ModelShape.from_gpt(parse_spec(GPT2).model)
    est = memory_per_gpu(shape, MemoryConfig(precision="fp32"))
    assert shape.total_params == n > 100_000_000
    assert (est.params, est.grads, est.optimizer) == (pb, gb, ob)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_peak_rss_of_gpt2_size_reference_run_within_15_percent(tmp_path: Path) -> None:
    spec_path = tmp_path / "gpt2.json"
    spec_path.write_text(json.dumps(GPT2))
    out = subprocess.run([sys.executable, "-c", MEASURE, str(spec_path), str(tmp_path / "run")],
                         capture_output=True, text=True, cwd=ROOT, timeout=580, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0
    measured = (got["peak_kb"] - got["base_kb"]) * 1024
    spec = parse_spec(GPT2)
    est = memory_per_gpu(ModelShape.from_gpt(spec.model), MemoryConfig(
        micro_batch=spec.training.micro_batch_size, precision="fp32",
        foreach_optimizer=False)).total
    assert abs(est - measured) / measured < 0.15, (est, measured)
