"""Parity of every pipeline layout with the single-process reference, through workers.launch.

Each launch runs several specs in one set of processes (``--spec`` repeated) to pay the
torchrun start-up once. Tolerance: LOSS_ATOL / GRAD_NORM_RTOL in pipeline_launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.workers.pipeline_launch import (
    FIXTURES,
    TINY,
    assert_ok,
    assert_parity,
    reference,
    run_dir,
    runner_used,
    torchrun,
)

TWO_RANK = [TINY / "pp-gpipe.yaml", TINY / "pp-1f1b.yaml", TINY / "pp-interleaved.yaml"]
FOUR_RANK = [TINY / "pp-dp.yaml", FIXTURES / "pp-fsdp.yaml"]


def _check_all(tmp: Path, *, nproc: int, specs: list[Path]) -> None:
    dist_out, ref_out = tmp / "dist", tmp / "ref"
    assert_ok(torchrun(nproc=nproc, specs=specs, out=dist_out))
    assert_ok(reference(specs=specs, out=ref_out))
    for spec in specs:
        d = run_dir(dist_out, spec, n_specs=len(specs))
        assert "runner=PipelineRunner" in runner_used(d, 0), spec.name
        assert_parity(d, run_dir(ref_out, spec, n_specs=len(specs)))


def test_gpipe_1f1b_interleaved_match_reference_on_2_ranks(tmp_path: Path) -> None:
    # gpipe also uses grad accumulation 2 (8 pipeline microbatches per step); interleaved
    # holds two virtual stages per rank.
    _check_all(tmp_path, nproc=2, specs=TWO_RANK)


def test_pp_with_ddp_and_fsdp_match_reference_on_4_ranks(tmp_path: Path) -> None:
    _check_all(tmp_path, nproc=4, specs=FOUR_RANK)


@pytest.mark.slow
def test_pp_fsdp_tp_3d_matches_reference_on_8_ranks(tmp_path: Path) -> None:
    _check_all(tmp_path, nproc=8, specs=[FIXTURES / "pp-fsdp-tp.yaml"])
