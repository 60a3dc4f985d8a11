"""Gradient compression under real 2-rank torchrun on gloo: int8 and Top-K against the
uncompressed single-process reference, the bytes each rank puts on the wire, and a resume
mid-run that restores Top-K's residuals (and PowerSGD's state).

Margins (12 steps, the tiny GPT, lr 3e-3):

* int8 (per-tensor uint8): every step's loss within 1e-2 of the reference (observed <= 3e-3).
* topk (10% of each gradient, error feedback): it learns (the loss falls by > 0.2) and ends
  within 0.3 of the reference (observed 0.2); steps after the first differ from it by > 1e-3,
  so the hook really dropped entries.

* topk with ``topk_start_iter: 3``: the first three steps are plain all-reduces (dense bytes,
  the reference's losses through step 4), Top-K from step 4 on.

Two launches: launch 1 runs the two examples, ``topk-warm`` (Top-K after a 3-step warm
start), ``straight`` (Top-K, 8 steps) and ``cut`` (the same spec, stopped after 4 with a
checkpoint), and a PowerSGD pair alike. Launch 2 resumes
``cut`` to 8 steps from its checkpoint, and ``cut-cold`` (a copy of the same checkpoint with
the comm hook's files removed) to show the residuals matter.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from tests.integration.workers.launch_helpers import (
    TINY,
    assert_ok,
    forkrun,
    metrics,
    reference,
    torchrun,
    variant,
)

INT8_LOSS_ATOL = 1e-2
TOPK_FINAL_MARGIN = 0.3
CKPT = {"enabled": True, "every_steps": 2, "keep": 2, "async_save": False}


def _tiny_numels() -> list[int]:
    from workers.loop.launch import load_spec
    from workers.loop.model import build_model

    spec = load_spec(TINY / "ddp-topk.yaml")
    return [p.numel() for p in build_model(spec, seed=0).module.parameters()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("compression")
    specs, out = tmp / "specs", tmp / "runs"

    def resumable(base: str, name: str, steps: int) -> Path:
        return variant(base, specs / str(steps), name=name, checkpoint=CKPT,
                       training={"steps": steps})

    warm = variant("ddp-topk", specs, name="topk-warm", training={
        "ddp": {"comm_hook": "topk", "topk_ratio": 0.1, "topk_start_iter": 3}})
    first = [TINY / "ddp-topk.yaml", TINY / "ddp-int8.yaml", warm,
             resumable("ddp-topk", "straight", 8), resumable("ddp-topk", "cut", 4),
             resumable("ddp-powersgd", "psgd-straight", 8),
             resumable("ddp-powersgd", "psgd-cut", 4)]
    assert_ok(torchrun(nproc=2, specs=first, out=out, timeout=300))
    shutil.copytree(out / "cut", out / "cut-cold")
    for hook_dir in (out / "cut-cold" / "checkpoints").glob("step_*/comm_hook"):
        shutil.rmtree(hook_dir)
    second = [resumable("ddp-topk", "cut", 8), resumable("ddp-topk", "cut-cold", 8),
              resumable("ddp-powersgd", "psgd-cut", 8)]
    # The resumes fork their ranks from one process that imported torch once (forkrun.py).
    assert_ok(forkrun(nproc=2, specs=second, out=out, timeout=300))
    return {p.stem: out / p.stem for p in [*first, *second]}


def _losses(run: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run)}


@pytest.mark.timeout(600)
def test_int8_tracks_the_uncompressed_reference(runs: dict[str, Path]) -> None:
    got, want = metrics(runs["ddp-int8"]), reference(TINY / "ddp-int8.yaml")
    assert [m["step"] for m in got] == list(range(1, 13))
    for g, w in zip(got, want, strict=True):
        assert abs(g["loss"] - w["loss"]) <= INT8_LOSS_ATOL, (g["step"], g["loss"], w["loss"])
    assert got[0]["loss"] - got[-1]["loss"] > 0.2
    # One bucket (the tiny model is < 1 MiB): a byte per element plus an fp32 scale and zero
    # point, against 4 bytes per element dense.
    numel = sum(_tiny_numels())
    for m in got:
        assert m["grad_comm_bytes"] == numel + 8
        assert m["grad_compression_ratio"] == pytest.approx(4 * numel / (numel + 8))


@pytest.mark.timeout(600)
def test_topk_converges_within_margin_and_sends_the_expected_bytes(
        runs: dict[str, Path]) -> None:
    got, want = metrics(runs["ddp-topk"]), reference(TINY / "ddp-topk.yaml")
    losses = [m["loss"] for m in got]
    assert [m["step"] for m in got] == list(range(1, 13))
    assert losses[0] - losses[-1] > 0.2
    assert abs(losses[-1] - want[-1]["loss"]) < TOPK_FINAL_MARGIN
    assert max(abs(g - w["loss"]) for g, w in zip(losses[1:], want[1:], strict=True)) > 1e-3
    # Per parameter ceil(10%) entries, each an fp32 value and an int32 index.
    numels = _tiny_numels()
    sent = 8 * sum(math.ceil(0.1 * n) for n in numels)
    for m in got:
        assert m["grad_comm_bytes"] == sent
        assert m["grad_compression_ratio"] == pytest.approx(4 * sum(numels) / sent)
    assert 4.9 < got[0]["grad_compression_ratio"] <= 5.0  # ~ 1 / (2 * topk_ratio)


@pytest.mark.timeout(600)
def test_topk_warm_start_sends_dense_gradients_first(runs: dict[str, Path]) -> None:
    got, want = metrics(runs["topk-warm"]), reference(TINY / "ddp-topk.yaml")
    numels = _tiny_numels()
    dense, sent = 4 * sum(numels), 8 * sum(math.ceil(0.1 * n) for n in numels)
    assert [m["grad_comm_bytes"] for m in got] == [dense] * 3 + [sent] * 9
    assert [m["grad_compression_ratio"] for m in got[:3]] == [1.0] * 3
    # Three uncompressed updates: step 4's loss (taken before its own update) is the
    # reference's; the compressed steps then leave it.
    for g, w in zip(got[:4], want[:4], strict=True):
        assert abs(g["loss"] - w["loss"]) <= 2e-5, (g["step"], g["loss"], w["loss"])
    assert max(abs(g["loss"] - w["loss"]) for g, w in zip(got[5:], want[5:], strict=True)) \
        > 1e-3


@pytest.mark.timeout(600)
def test_topk_resume_restores_the_residuals_and_continues_exactly(
        runs: dict[str, Path]) -> None:
    straight, cut, cold = (_losses(runs[n]) for n in ("straight", "cut", "cut-cold"))
    assert sorted(cut) == list(range(1, 9))
    log = (runs["cut"] / "logs" / "rank_0.log").read_text()
    assert "resumed from checkpoint at step 4 with the comm hook's state" in log
    for step in range(1, 9):
        assert cut[step] == pytest.approx(straight[step], rel=1e-6, abs=1e-7), step
    # Without the residuals the resumed run leaves the trajectory: step 5's loss is taken
    # before its update, so step 6 is the first to see the residual-less gradient.
    assert "comm hook's state" not in (runs["cut-cold"] / "logs" / "rank_0.log").read_text()
    assert cold[5] == pytest.approx(straight[5], rel=1e-6, abs=1e-7)
    assert abs(cold[6] - straight[6]) > 1e-4


@pytest.mark.timeout(600)
def test_powersgd_resume_restores_its_state(runs: dict[str, Path]) -> None:
    straight, cut = _losses(runs["psgd-straight"]), _losses(runs["psgd-cut"])
    log = (runs["psgd-cut"] / "logs" / "rank_0.log").read_text()
    assert "resumed from checkpoint at step 4 with the comm hook's state" in log
    # Compressing from step 3 on: the resumed run keeps compressing (a fresh PowerSGDState
    # would run plain all-reduces again) with the saved error feedback and warm-start Q.
    assert metrics(runs["psgd-cut"])[-1]["grad_compression_ratio"] > 5
    for step in range(5, 9):
        assert cut[step] == pytest.approx(straight[step], rel=1e-6, abs=1e-7), step
