"""Checkpoints: resume parity, and a DDP checkpoint loaded under FSDP.

Two 2-rank launches share one ``--out``. Launch 1 trains three specs for 6 of 12 steps,
saving every 3 (async DCP for DDP and FSDP, ZeRO-1's consolidated optimizer file). Launch 2
(new processes, fresh models) runs specs with the same file stems, so each resumes from its
run dir's newest complete checkpoint (step 6) and trains to 12:

* ``resume``:       DDP -> FSDP (ZeRO-3): DCP reshards full tensors into FSDP shards.
* ``resume-fsdp``:  FSDP -> FSDP.
* ``resume-zero1``: ZeRO-1 -> ZeRO-1.

The stitched 12-step trajectory must equal the uninterrupted single-process reference —
which only holds if both model and optimizer state (AdamW moments) came back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.workers.launch_helpers import (
    assert_ok,
    assert_parity,
    forkrun,
    heartbeat,
    metrics,
    reference,
    torchrun,
    variant,
)
from workers.loop.checkpoint import complete_steps

CKPT = {"enabled": True, "every_steps": 3, "keep": 2, "async_save": True}


@pytest.mark.slow  # two 2-rank launches of three specs each
def test_resume_and_ddp_to_fsdp(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    phase1 = [
        variant("ddp", first, name="resume", checkpoint=CKPT),
        variant("fsdp", first, name="resume-fsdp", checkpoint=CKPT),
        variant("zero1", first, name="resume-zero1", checkpoint=CKPT),
    ]
    phase2 = [
        variant("fsdp", second, name="resume", checkpoint=CKPT),
        phase1[1],
        phase1[2],
    ]
    out = tmp_path / "runs"
    assert_ok(torchrun(nproc=2, specs=phase1, out=out, extra=["--steps", "6"]))
    for spec in phase1:
        # keep=2 pruned nothing yet (steps 3 and 6), every save completed.
        assert complete_steps(out / spec.stem / "checkpoints") == [3, 6]
    assert_ok(torchrun(nproc=2, specs=phase2, out=out, extra=["--steps", "12"]))

    for spec in phase1:
        run = out / spec.stem
        log = (run / "logs" / "rank_0.log").read_text()
        assert "resumed from checkpoint at step 6" in log
        got = metrics(run)  # launch 1 wrote steps 1-6, launch 2 appended 7-12
        assert_parity(got, reference(spec, steps=12), min_steps=12)
        # keep=2: the newest two of 3, 6, 9, 12.
        assert complete_steps(run / "checkpoints") == [9, 12]
        marker = json.loads((run / "checkpoints" / "step_00000012" / "COMPLETE").read_text())
        assert marker == {"step": 12}
    # The same run dir really trained under DDP first and FSDP after the resume.
    log = (out / "resume" / "logs" / "rank_0.log").read_text()
    assert log.index("dp=ddp") < log.index("dp=fsdp")


def test_resume_restores_each_ranks_rng_so_dropout_continues_the_same(tmp_path: Path) -> None:
    """With dropout, the masks after a restart are drawn from the RNG: a resumed run matches
    the uninterrupted one only if every rank's RNG state came back with the checkpoint.

    Launch 1 trains ``straight`` for 6 steps and ``cut`` for 3 (steps from the specs); launch
    2 runs ``cut`` again with 6 steps (same file stem, so the same run dir) and resumes."""
    model = {"kind": "gpt", "n_layers": 2, "n_heads": 4, "d_model": 64, "vocab_size": 128,
             "seq_len": 32, "dropout": 0.3}
    ckpt = {"enabled": True, "every_steps": 3, "keep": 2, "async_save": False}

    def spec(d: str, name: str, steps: int) -> Path:
        return variant("ddp", tmp_path / d, name=name, model=model, checkpoint=ckpt,
                       training={"steps": steps})

    out = tmp_path / "runs"
    # Ranks forked from one process (forkrun.py): the test above resumes under torchrun.
    assert_ok(forkrun(nproc=2, specs=[spec("a", "straight", 6), spec("a", "cut", 3)], out=out))
    assert sorted(p.name for p in (out / "cut" / "checkpoints" / "step_00000003" / "rng")
                  .iterdir()) == ["rank_0.pt", "rank_1.pt"]
    assert_ok(forkrun(nproc=2, specs=[spec("b", "cut", 6)], out=out / "cut"))
    log = (out / "cut" / "logs" / "rank_0.log").read_text()
    assert "resumed from checkpoint at step 3" in log and "reseeded" not in log
    # Each rank's heartbeat says where it resumed: the watchdog's first-step rule needs it.
    assert [heartbeat(out / "cut", r)["start_step"] for r in (0, 1)] == [3, 3]
    want = {m["step"]: m["loss"] for m in metrics(out / "straight")}
    got = {m["step"]: m["loss"] for m in metrics(out / "cut")}
    assert sorted(got) == list(range(1, 7))
    for step in range(4, 7):
        assert got[step] == pytest.approx(want[step], rel=1e-6, abs=1e-7), step
