"""Single-process units of the worker core: data sharding, env, faults, model build, grads,
callbacks, heartbeat."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from orchestrator.spec import FaultKind, InjectFault, parse_spec
from workers.host.env import debug_env, worker_env
from workers.host.faults import CollectiveAction, FaultInjector
from workers.loop.callbacks import FileCallbacks, Phase, read_metrics
from workers.loop.data import DataSource
from workers.loop.grads import clip_grad_norm
from workers.loop.heartbeat import HeartbeatThread, Progress
from workers.loop.model import GPT, ModelBuildError, build_model, resolve_builder

TINY = {"name": "t", "model": {"n_layers": 2, "n_heads": 2, "d_model": 16, "vocab_size": 32,
                                "seq_len": 8},
        "training": {"micro_batch_size": 2, "grad_accum_steps": 2},
        "parallelism": {"dp_replicate": 2}}


def _source(shards: list[int], **kw: object) -> DataSource:
    spec = parse_spec({**TINY, **kw})
    return DataSource(spec, seed=5, shards=shards, vocab_size=32, seq_len=8,
                      device=torch.device("cpu"))


def test_reference_batch_is_the_concatenation_of_the_shards() -> None:
    ref, s0, s1 = _source([0, 1]), _source([0]), _source([1])
    for step in (1, 7):
        for r, a, b in zip(ref.batches(step), s0.batches(step), s1.batches(step), strict=True):
            assert torch.equal(r.inputs, torch.cat([a.inputs, b.inputs]))
            assert r.inputs.shape == (4, 8)
    assert len(ref.batches(1)) == 2  # one per accumulation micro-step


def test_data_is_deterministic_and_varies() -> None:
    a, b = _source([0]).batches(3), _source([0]).batches(3)
    assert torch.equal(a[0].inputs, b[0].inputs)
    assert not torch.equal(a[0].inputs, a[1].inputs)
    assert not torch.equal(_source([0]).batches(4)[0].inputs, a[0].inputs)
    # next-token targets
    assert torch.equal(a[0].inputs[:, 1:], a[0].targets[:, :-1])


def test_text_file_data(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_bytes(b"hello meshyard " * 20)
    spec = parse_spec({**TINY, "model": {**TINY["model"], "vocab_size": 256},
                       "data": {"kind": "text_file", "path": str(f)}})
    src = DataSource(spec, seed=0, shards=[0], vocab_size=256, seq_len=8,
                     device=torch.device("cpu"))
    row = bytes(src.batches(1)[0].inputs[0].tolist())
    assert row in f.read_bytes()
    with pytest.raises(ValueError, match="vocab_size >= 256"):
        DataSource(spec, seed=0, shards=[0], vocab_size=32, seq_len=8,
                   device=torch.device("cpu"))


def test_worker_env_has_rank_and_debug_vars(tmp_path: Path) -> None:
    spec = parse_spec({**TINY, "debug": {"nccl_debug": "INFO", "flight_recorder_entries": 500}})
    env = worker_env(spec, rank=3, local_rank=1, world_size=4, local_world_size=2,
                     master_addr="127.0.0.1", master_port=29400, run_dir=tmp_path)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("3", "1", "4")
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path.resolve() / "nccl" / "%h.%p.log")
    assert env["TORCH_FR_BUFFER_SIZE"] == "500"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith(str(tmp_path.resolve()))
    assert set(debug_env(spec, run_dir=tmp_path)) <= set(env)


def test_fault_injector_decisions() -> None:
    f = FaultInjector(InjectFault(kind=FaultKind.DESYNC, rank=1, step=3), rank=1)
    assert f.before_collective(2) == CollectiveAction.RUN
    assert f.before_collective(3) == CollectiveAction.SKIP
    assert FaultInjector(InjectFault(kind=FaultKind.DESYNC, rank=1, step=3),
                         rank=0).before_collective(3) == CollectiveAction.RUN
    m = FaultInjector(InjectFault(kind=FaultKind.MISMATCH, rank=0, step=1), rank=0)
    assert m.before_collective(1) == CollectiveAction.MISMATCH
    # Only in the configured attempt: a restart runs clean.
    assert FaultInjector(InjectFault(kind=FaultKind.MISMATCH, rank=0, step=1), rank=0,
                         attempt=2).before_collective(1) == CollectiveAction.RUN
    slow = FaultInjector(InjectFault(kind=FaultKind.SLOW, rank=0, step=2, seconds=0.05), rank=0)
    t0 = time.monotonic()
    slow.before_step(2)
    assert time.monotonic() - t0 >= 0.05


def test_resolve_builder_errors() -> None:
    with pytest.raises(ModelBuildError, match="cannot import module 'no_such_pkg_x.mod'"):
        resolve_builder("no_such_pkg_x.mod:build")
    with pytest.raises(ModelBuildError, match="has no callable 'nope'"):
        resolve_builder("workers.loop.model:nope")


def test_gpt_builds_identically_per_seed_and_splits_cleanly() -> None:
    spec = parse_spec(TINY)
    a, b = build_model(spec, seed=1).module, build_model(spec, seed=1).module
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert isinstance(a, GPT)
    tokens = torch.randint(0, 32, (2, 8))
    assert a(tokens).shape == (2, 8, 32)
    # A pipeline stage drops the ends; forward then maps hidden states to hidden states.
    a.embed, a.norm, a.lm_head = None, None, None
    assert a(torch.randn(2, 8, 16)).shape == (2, 8, 16)


def test_clip_grad_norm_matches_torch() -> None:
    torch.manual_seed(0)
    m1, m2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    m2.load_state_dict(m1.state_dict())
    x = torch.randn(4, 8)
    for m in (m1, m2):
        m(x).pow(2).sum().backward()
    want = float(torch.nn.utils.clip_grad_norm_(m1.parameters(), 0.1))
    got = clip_grad_norm(m2.parameters(), 0.1)
    assert got == pytest.approx(want, rel=1e-6)
    for p1, p2 in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.allclose(p1.grad, p2.grad, rtol=1e-5, atol=1e-8)


def test_file_callbacks_and_heartbeat_thread(tmp_path: Path) -> None:
    cb = FileCallbacks(tmp_path, rank=0)
    progress = Progress()
    hb = HeartbeatThread(progress, cb, rank=0, interval_s=0.01).start()
    progress.enter(Phase.BACKWARD, step=4)
    cb.on_step({"step": 4, "loss": 1.0})
    deadline = time.time() + 5
    while time.time() < deadline:
        beat = json.loads((tmp_path / "heartbeats" / "rank_0.json").read_text() or "{}") \
            if (tmp_path / "heartbeats" / "rank_0.json").exists() else {}
        if beat.get("step") == 4:
            break
        time.sleep(0.01)
    hb.stop()
    cb.close()
    assert beat["phase"] == "backward"
    assert read_metrics(tmp_path) == [{"step": 4, "loss": 1.0}]


def test_mfu_math_and_no_peak_on_cpu() -> None:
    from workers.loop import mfu
    assert mfu.peak_flops(torch.device("cpu")) is None
    fpt = mfu.flops_per_token(n_params=1000, n_layers=2, d_model=8, seq_len=4)
    assert fpt == 6 * 1000 + 12 * 2 * 8 * 4
    # 1e12 FLOP/s achieved on 2 GPUs of 1e12 peak each = 50 %.
    assert mfu.mfu(tokens_per_s=1e12 / fpt, flops_per_token=fpt, peak=1e12,
                   world_size=2) == pytest.approx(0.5)


def test_run_training_stops_between_steps_on_stop_event(tmp_path: Path) -> None:
    import threading

    from workers.loop.train import run_training

    stop = threading.Event()

    class StopAt3:
        def __init__(self) -> None:
            self.steps: list[int] = []
            self.beats: list[str] = []

        def on_step(self, metrics: dict) -> None:
            self.steps.append(metrics["step"])
            if metrics["step"] == 3:
                stop.set()

        def on_heartbeat(self, hb: object) -> None:
            self.beats.append(hb.phase.value)  # type: ignore[attr-defined]

        def on_log(self, level: str, message: str) -> None:
            pass

    cb = StopAt3()
    spec = parse_spec({**TINY, "checkpoint": {"enabled": False}})
    result = run_training(spec, out_dir=tmp_path, callbacks=cb, steps=10, stop_event=stop,
                          reference=True)
    # The stop set during step 3's callback is seen by step 4's all-reduce (stop votes ride on
    # the loss collective), so the run ends after step 4.
    assert (result.stopped, result.last_step, cb.steps) == (True, 4, [1, 2, 3, 4])
    assert cb.beats[-1] == "done"  # the final heartbeat reports the end


_FLOOR_SCRIPT = r"""
import json, os
import torch, torch.distributed as dist
from workers.loop.heartbeat import Progress, collective_seqs
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"],
                        rank=0, world_size=1)
bg = dist.new_group(backend="gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(4))
dist.all_reduce(torch.ones(4), group=bg)
progress = Progress()
progress.background_groups = frozenset({bg.group_name})
progress.settle_collectives()
raw = collective_seqs()
print(json.dumps({"bg": bg.group_name, "floor": progress.completed_floor,
                  "raw": {k: v.last_enqueued for k, v in raw.items()},
                  "clamped": {k: v.last_completed
                              for k, v in collective_seqs({k: 99 for k in raw}).items()}}))
dist.destroy_process_group()
"""


def test_step_start_floor_covers_training_groups_not_background_ones() -> None:
    """Gloo's completion watermark can go backwards (two worker threads); the step-start
    floor marks what the previous step enqueued on training groups as completed, never a
    background group's (async checkpoint) and never past the last enqueued seq."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "PORT": str(port)}
    proc = subprocess.run([sys.executable, "-c", _FLOOR_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    default = next(k for k in got["raw"] if k != got["bg"])
    assert got["floor"] == {default: got["raw"][default]}  # background group left out
    assert got["raw"][default] >= 3
    assert got["clamped"] == got["raw"]  # a floor never claims more than was enqueued


class _FakeNvml:
    """pynvml's names, answering for two GPUs (the GPU fields of a utilisation sample)."""

    class NVMLError(Exception):
        pass

    inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i > 1:
            raise self.NVMLError("no such GPU")
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return type("U", (), {"gpu": 70 + h})()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return type("M", (), {"used": (h + 1) * 2**30, "total": 80 * 2**30})()


def test_usage_samples_the_process_and_its_gpu_through_nvml() -> None:
    from workers.host.sampling import NodeSampler, Nvml, ProcessSampler

    nvml = Nvml(module=_FakeNvml())
    s = ProcessSampler(gpu_index=1, nvml=nvml, min_interval_s=60)
    first = s.sample()
    assert first is not None and first["rss_bytes"] > 10 * 2**20
    assert (first["gpu_util"], first["gpu_mem_bytes"]) == (71.0, 2 * 2**30)
    assert s.sample() is None  # within the sampling interval
    assert nvml.gpu(5) is None  # an error is a missing field, never an exception
    fake = _FakeNvml()
    sampler = NodeSampler(nvml=Nvml(module=fake), cpu_window_s=0.2)
    node = sampler.sample("n1")
    assert [g["util"] for g in node["gpus"]] == [70.0, 71.0]
    assert node["mem_total_bytes"] > node["mem_used_bytes"] > 0
    again = sampler.sample("n1")  # right after: the CPU % still covers a whole window
    assert again["at"] - node["at"] >= 0.15 and 0.0 <= again["cpu_percent"] <= 100.0
    assert fake.inits == 1  # NVML opened once for the sampler's life
    cpu_only = ProcessSampler(gpu_index=None, min_interval_s=0).sample()
    assert cpu_only is not None and cpu_only["gpu_util"] is None


def _moe_router_grads(coef: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One LocalStepRunner step of a tiny MoE GPT: (the first layer's router grad, the last
    layer's expert grads, reported loss)."""
    from workers.loop.moe import moe_layers
    from workers.loop.runner import LocalStepRunner
    from workers.loop.step_contract import Batch

    spec = parse_spec({**TINY, "parallelism": {}, "model": {
        **TINY["model"], "moe": {"experts": 4, "top_k": 2, "aux_loss_coef": coef}}})
    module = build_model(spec, seed=0).module
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (2, 9), generator=g)
    runner = LocalStepRunner(module)
    loss = runner.train_step([Batch(tokens[:, :-1], tokens[:, 1:])], step=1,
                             progress=Progress())
    first, last = moe_layers(module)[0], moe_layers(module)[-1]
    assert first.router.weight.grad is not None and last.experts.w_up.grad is not None
    return first.router.weight.grad.clone(), last.experts.w_up.grad.clone(), float(loss)


def test_moe_aux_loss_is_trained_on_with_its_coefficient() -> None:
    r0, e0, loss0 = _moe_router_grads(0.0)
    r1, e1, loss1 = _moe_router_grads(0.01)
    r10, _, _ = _moe_router_grads(0.1)
    # The reported loss is the language-model loss whatever the coefficient.
    assert loss0 == loss1
    # The term reaches the router (through the mean router probabilities), linearly in the
    # coefficient; the last layer's experts sit downstream of no router term, so their
    # gradients are the language-model ones.
    assert (r1 - r0).abs().max() > 1e-6
    torch.testing.assert_close(r10 - r0, 10 * (r1 - r0), rtol=1e-2,
                               atol=1e-3 * float((r1 - r0).abs().max()))
    torch.testing.assert_close(e1, e0)


def test_moe_aux_loss_coef_is_bounded() -> None:
    assert parse_spec({"name": "x", "model": {"moe": {"experts": 4}}}
                      ).model.moe.aux_loss_coef == 0.01
    for bad in (-0.1, 2.0):
        with pytest.raises(ValueError, match="aux_loss_coef"):
            parse_spec({"name": "x", "model": {"moe": {"experts": 4, "aux_loss_coef": bad}}})
