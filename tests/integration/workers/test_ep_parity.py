"""Expert parallel parity: MoE GPT under real torchrun on gloo vs the single-process reference
(same seed, same routing: capacity is per sequence, so a rank's share of the batch routes as
the whole batch does), at the tolerances of test_parity.py.

* ep.yaml       2 ranks, ep=2 (2 of 4 experts per rank), gradient accumulation 2
* ep4           4 ranks, ep=4 (one expert per rank)
* ep-fsdp.yaml  4 ranks, ep=2 x dp_shard=2 (experts also FSDP-sharded over dp_shard)

Teardown is clean: torchrun's output carries no "terminate called" from a rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.workers.launch_helpers import (
    TINY,
    assert_ok,
    assert_parity,
    metrics,
    reference,
    torchrun,
    variant,
)


def _launch(tmp: Path, *, nproc: int, specs: list[Path]) -> dict[str, Path]:
    out = tmp / "runs"
    proc = torchrun(nproc=nproc, specs=specs, out=out, timeout=400)
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


@pytest.mark.timeout(600)
def test_ep2_matches_reference(tmp_path: Path) -> None:
    runs = _launch(tmp_path, nproc=2, specs=[TINY / "ep.yaml"])
    _check(TINY / "ep.yaml", runs["ep"])


@pytest.mark.slow  # one 4-rank launch of two specs
@pytest.mark.timeout(600)
def test_ep4_and_ep_fsdp_match_reference(tmp_path: Path) -> None:
    ep4 = variant("ep", tmp_path / "specs", name="ep4", parallelism={"ep": 4},
                  training={"grad_accum_steps": 1})
    specs = [ep4, TINY / "ep-fsdp.yaml"]
    runs = _launch(tmp_path, nproc=4, specs=specs)
    for spec in specs:
        _check(spec, runs[spec.stem])
