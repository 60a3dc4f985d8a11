"""Parity of every pipeline layout with the single-process reference, through workers.loop.launch.

Each launch runs several specs in one set of processes (``--spec`` repeated) to pay the
start-up once. The 2-rank layouts launch under torchrun; the others fork their ranks from one
process that imported torch once (forkrun.py). Tolerance: LOSS_ATOL / GRAD_NORM_RTOL in
pipeline_launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.workers.launch_helpers import variant
from tests.integration.workers.pipeline_launch import (
    FIXTURES,
    TINY,
    assert_ok,
    assert_parity,
    forkrun,
    metrics,
    reference,
    run_dir,
    runner_used,
    torchrun,
)

TWO_RANK = [TINY / "pp-gpipe.yaml", TINY / "pp-1f1b.yaml", TINY / "pp-interleaved.yaml"]
FOUR_RANK = [TINY / "pp-dp.yaml", FIXTURES / "pp-fsdp.yaml"]


def _check_all(tmp: Path, *, nproc: int, specs: list[Path], fork: bool = True) -> Path:
    dist_out, ref_out = tmp / "dist", tmp / "ref"
    assert_ok((forkrun if fork else torchrun)(nproc=nproc, specs=specs, out=dist_out))
    assert_ok(reference(specs=specs, out=ref_out))
    for spec in specs:
        d = run_dir(dist_out, spec, n_specs=len(specs))
        assert "runner=PipelineRunner" in runner_used(d, 0), spec.name
        assert_parity(d, run_dir(ref_out, spec, n_specs=len(specs)))
    return dist_out


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # gpipe also uses grad accumulation 2 (8 pipeline microbatches per step); interleaved
    # holds two virtual stages per rank.
    return _check_all(tmp_path_factory.mktemp("pp2"), nproc=2, specs=TWO_RANK, fork=False)


def test_gpipe_1f1b_interleaved_match_reference_on_2_ranks(two_rank_runs: Path) -> None:
    assert all((two_rank_runs / s.stem / "metrics.jsonl").is_file() for s in TWO_RANK)


@pytest.mark.slow
def test_interleaved_resume_continues_the_same_trajectory(two_rank_runs: Path,
                                                          tmp_path: Path) -> None:
    """Stop after 6 steps (checkpoints at 3 and 6, async), resume to 12: the losses equal
    the uninterrupted run's exactly (each rank reloads its own stages' parameters and AdamW
    state by FQN)."""
    doc = yaml.safe_load((TINY / "pp-interleaved.yaml").read_text())
    doc["checkpoint"] = {"enabled": True, "every_steps": 3, "async_save": True}
    spec = tmp_path / "pp-interleaved-ckpt.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"
    assert_ok(forkrun(nproc=2, specs=[spec], out=out, steps=6))
    assert_ok(forkrun(nproc=2, specs=[spec], out=out, steps=12))
    assert "resumed from checkpoint at step 6" in runner_used(out, 0)
    got = [(m["step"], m["loss"]) for m in metrics(out)]
    want = [(m["step"], m["loss"]) for m in metrics(two_rank_runs / "pp-interleaved")]
    assert got == want


@pytest.mark.slow  # ~45 s: three 4-rank specs on 2 cores
def test_pp_with_ddp_and_fsdp_match_reference_on_4_ranks(tmp_path: Path) -> None:
    # ZeRO-0 over dp_shard ranks: the stages' gradients average over them too.
    ddp_shard = variant("pp-dp", tmp_path / "specs", name="pp-ddp-shard",
                        parallelism={"dp_replicate": 1, "dp_shard": 2, "zero_stage": 0})
    _check_all(tmp_path, nproc=4, specs=[*FOUR_RANK, ddp_shard])


@pytest.mark.slow
def test_pp_fsdp_tp_3d_and_pp_ddp_tp_match_reference_on_8_ranks(tmp_path: Path) -> None:
    ddp_tp = variant("pp-dp", tmp_path / "specs", name="pp-dp-tp", parallelism={"tp": 2})
    _check_all(tmp_path, nproc=8, specs=[FIXTURES / "pp-fsdp-tp.yaml", ddp_tp])
