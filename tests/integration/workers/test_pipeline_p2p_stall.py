"""Fault ``p2p_stall``: a pipeline stage never sends; its peer's receive times out for real.

Rank 0 (stage 0) blocks at step 3 just before sending its first activation. Rank 1 (stage 1)
waits in the gloo receive until the steady-state collective timeout (3 s here) fires and
exits with an error; torchrun then ends the job. Steps 1-2 complete normally.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.integration.workers.pipeline_launch import TINY, metrics, torchrun

STALL_STEP = 3


def _stall_spec(tmp: Path) -> Path:
    doc = yaml.safe_load((TINY / "pp-1f1b.yaml").read_text())
    doc["name"] = "pp-p2p-stall"
    doc["training"]["steps"] = 5
    doc["fault_tolerance"] = {"init_timeout_s": 60, "collective_timeout_s": 3}
    doc["inject_fault"] = {"kind": "p2p_stall", "rank": 0, "step": STALL_STEP}
    path = tmp / "pp-p2p-stall.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_p2p_stall_blocks_the_sender_and_times_out_the_receiver(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = torchrun(nproc=2, specs=[_stall_spec(tmp_path)], out=out,
                    extra=["--heartbeat-interval", "0.2"], timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-4000:]
    # The receiver failed in a p2p receive on the collective timeout, not in some other way.
    assert "Timed out waiting 3000ms for recv" in text, text[-6000:]
    assert f"p2p_stall: stage never sends at step {STALL_STEP}" in text, text[-6000:]
    # Steps before the fault trained; the stalled step never finished on rank 0. Rows reach
    # the metrics at the loop's sync steps (workers/loop/stepsync.py; step 1 always syncs).
    steps = [m["step"] for m in metrics(out)]
    assert steps == list(range(1, len(steps) + 1)) and 1 <= len(steps) < STALL_STEP, steps
    # The stalled rank kept heartbeating from inside the step, in the forward phase (the send
    # follows the forward of the first microbatch) — what the watchdog reads.
    hb = json.loads((out / "heartbeats" / "rank_0.json").read_text())
    assert hb["step"] == STALL_STEP
    assert hb["phase"] == "forward"
