"""Expert parallel parity: MoE GPT under real torchrun on gloo vs the single-process reference
(same seed, same routing: capacity is per sequence, so a rank's share of the batch routes as
the whole batch does), at the tolerances of test_parity.py.

* ep.yaml       2 ranks, ep=2 (2 of 4 experts per rank), gradient accumulation 2
* ep4           4 ranks, ep=4 (one expert per rank)
* ep-fsdp.yaml  4 ranks, ep=2 x dp_shard=2 (experts also FSDP-sharded over dp_shard)

The reference runs the same loop in one process, so it trains on the same objective: the
language-model loss plus ``aux_loss_coef`` x the load-balancing loss.

Checkpoints (the learning rate is constant, so a run of fewer steps is a prefix of ep.yaml's):
``cut`` (ep.yaml stopped after 4 steps with a checkpoint, in ep.yaml's launch), then ``cut``
resumed to 8 steps continues the uninterrupted run to 1e-6, and ``cut-ep1`` (a copy of the
same checkpoint resumed with ep=1 x dp_shard=2: every rank holds all experts, FSDP-sharded)
continues it at the parity tolerance: DCP re-splits the experts, saved as one tensor of the
full set. The slow 4-rank test does the same from ep=2 x dp_shard=2 (experts FSDP-sharded
within the ep block) to itself and to ep=4.

The 2-rank runs launch under torchrun, the 4-rank ones fork their ranks from one process that
imported torch once (forkrun.py). Teardown is clean: no launch's output carries "terminate
called" from a rank.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.workers.launch_helpers import (
    LOSS_ATOL,
    TINY,
    assert_ok,
    assert_parity,
    forkrun,
    metrics,
    reference,
    torchrun,
    variant,
)

CKPT = {"enabled": True, "every_steps": 2, "keep": 2, "async_save": False}


def _launch(tmp: Path, *, nproc: int, specs: list[Path], fork: bool = False) -> dict[str, Path]:
    out = tmp / "runs"
    proc = (forkrun if fork else torchrun)(nproc=nproc, specs=specs, out=out, timeout=400)
    assert_ok(proc)
    assert "terminate called" not in proc.stdout + proc.stderr
    # One spec writes into --out itself, several into --out/<stem>.
    return {s.stem: out / s.stem if len(specs) > 1 else out for s in specs}


def _check(spec: Path, run: Path) -> None:
    got = metrics(run)
    assert_parity(got, reference(spec))
    assert "dp=ep-fsdp" in (run / "logs" / "rank_0.log").read_text()
    # The load-balancing loss is reported every step: experts * sum f_e P_e, 1.0 when balanced.
    aux = [m["moe_aux_loss"] for m in got]
    assert len(aux) == len(got) and all(0.99 < a < 4.0 for a in aux)


@pytest.fixture(scope="module")
def ep2_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ep2")
    specs = tmp / "specs"

    def resumable(name: str, steps: int, **changes: object) -> Path:
        return variant("ep", specs / str(steps), name=name, checkpoint=CKPT,
                       training={"steps": steps}, **changes)

    first = [TINY / "ep.yaml", resumable("cut", 4)]
    runs = _launch(tmp, nproc=2, specs=first)
    shutil.copytree(runs["cut"], runs["cut"].parent / "cut-ep1")
    second = [resumable("cut", 8),
              resumable("cut-ep1", 8, parallelism={"ep": 1, "dp_shard": 2})]
    return runs | _launch(tmp, nproc=2, specs=second)


@pytest.mark.timeout(900)
def test_ep2_matches_reference(ep2_runs: dict[str, Path]) -> None:
    _check(TINY / "ep.yaml", ep2_runs["ep"])


def _losses(run: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run)}


@pytest.mark.timeout(900)
def test_ep2_resume_continues_exactly_and_under_another_ep_degree(
        ep2_runs: dict[str, Path]) -> None:
    straight, cut, ep1 = (_losses(ep2_runs[n]) for n in ("ep", "cut", "cut-ep1"))
    assert sorted(cut) == sorted(ep1) == list(range(1, 9))
    assert "resumed from checkpoint at step 4" in (ep2_runs["cut"] / "logs" / "rank_0.log"
                                                   ).read_text()
    # The checkpoint holds the experts as the full set (4 per layer, not each rank's 2 under
    # one name), weights and Adam moments alike.
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(ep2_runs["cut"] / "checkpoints" / "step_00000008")
                             ).read_metadata().state_dict_metadata
    for key in ("model.layers.0.mlp.experts.w_up",
                "optim.state.layers.1.mlp.experts.w_down.exp_avg"):
        meta = saved[key]
        assert tuple(meta.size) in ((4, 64, 256), (4, 256, 64)), key
        assert sorted(c.offsets[0] for c in meta.chunks) == [0, 2], key  # one block per rank
    for step in range(1, 9):
        assert cut[step] == pytest.approx(straight[step], rel=1e-6, abs=1e-7), step
    log = (ep2_runs["cut-ep1"] / "logs" / "rank_0.log").read_text()
    assert "resumed from checkpoint at step 4" in log and "dp=fsdp" in log
    for step in range(5, 9):
        assert abs(ep1[step] - straight[step]) <= LOSS_ATOL, step


@pytest.mark.slow  # two 4-rank launches
@pytest.mark.timeout(900)
def test_ep4_and_ep_fsdp_match_reference_and_resume(tmp_path: Path) -> None:
    ep4 = variant("ep", tmp_path / "specs", name="ep4", parallelism={"ep": 4},
                  training={"grad_accum_steps": 1})

    def resumable(name: str, steps: int, **changes: object) -> Path:
        return variant("ep-fsdp", tmp_path / "specs" / str(steps), name=name,
                       checkpoint=CKPT, training={"steps": steps}, **changes)

    specs = [ep4, TINY / "ep-fsdp.yaml"]
    runs = _launch(tmp_path, nproc=4, specs=[*specs, resumable("fsdp-cut", 4)], fork=True)
    for spec in specs:
        _check(spec, runs[spec.stem])
    shutil.copytree(runs["fsdp-cut"], runs["fsdp-cut"].parent / "fsdp-cut-ep4")
    runs |= _launch(tmp_path, nproc=4, specs=[
        resumable("fsdp-cut", 8),
        resumable("fsdp-cut-ep4", 8, parallelism={"ep": 4, "dp_shard": 1})], fork=True)
    straight = _losses(runs["ep-fsdp"])
    cut, ep4_resumed = _losses(runs["fsdp-cut"]), _losses(runs["fsdp-cut-ep4"])
    assert sorted(cut) == sorted(ep4_resumed) == list(range(1, 9))
    for step in range(1, 9):
        assert cut[step] == pytest.approx(straight[step], rel=1e-6, abs=1e-7), step
    for step in range(5, 9):
        assert abs(ep4_resumed[step] - straight[step]) <= LOSS_ATOL, step
