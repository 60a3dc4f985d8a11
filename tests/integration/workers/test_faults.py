"""Each injected fault does what it says, in a real 2-rank gloo job (DDP tiny spec).

The steady-state collective timeout is 2 s, so a peer stuck in a collective fails within
seconds. Heartbeat files (every 0.2 s, from a side thread) are the watchdog's view and are
checked where the fault shows in them.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from tests.integration.workers.launch_helpers import (
    assert_ok,
    assert_parity,
    heartbeat,
    kill_tree,
    metrics,
    popen_torchrun,
    reference,
    torchrun,
    variant,
)
from workers.host.faults import CRASH_EXIT_CODE

STEP = 3
TIMEOUT_S = 2
HB = ["--heartbeat-interval", "0.2"]


def _spec(tmp: Path, kind: str, *, rank: int = 1, **extra: float) -> Path:
    return variant("ddp", tmp, name=f"fault-{kind}", training={"steps": 6},
                   fault_tolerance={"init_timeout_s": 60, "collective_timeout_s": TIMEOUT_S},
                   inject_fault={"kind": kind, "rank": rank, "step": STEP, **extra})


def _run(tmp: Path, kind: str, **extra: float) -> tuple[str, Path]:
    out = tmp / "run"
    proc = torchrun(nproc=2, specs=[_spec(tmp, kind, **extra)], out=out, extra=HB, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-4000:]
    return text, out


def _assert_rows_before_fault(out: Path) -> None:
    """Rows reach the metrics at the loop's sync steps (workers/loop/stepsync.py): a job that dies
    at STEP has every row up to its last sync before STEP, in order, and none after."""
    steps = [m["step"] for m in metrics(out)]
    assert steps == list(range(1, len(steps) + 1)), steps
    assert 1 <= len(steps) < STEP, steps  # step 1 always syncs


def _pending(hb: dict) -> dict[str, int]:
    """Per group: collectives enqueued but not completed."""
    return {pg: s["last_enqueued"] - s["last_completed"] for pg, s in hb["collectives"].items()}


def test_crash_exits_the_rank(tmp_path: Path) -> None:
    text, out = _run(tmp_path, "crash")
    assert f"crash: rank 1 exits at step {STEP}" in text
    assert f"exitcode  : {CRASH_EXIT_CODE}" in text, text[-4000:]
    _assert_rows_before_fault(out)


def test_hang_blocks_until_the_peer_times_out(tmp_path: Path) -> None:
    text, out = _run(tmp_path, "hang")
    assert f"hang: blocking forever before the step {STEP} collective" in text
    # Rank 0 failed in the collective on the steady-state timeout, not some other way.
    assert "Timed out" in text or "timed out" in text, text[-6000:]
    _assert_rows_before_fault(out)
    hb0, hb1 = heartbeat(out, 0), heartbeat(out, 1)
    assert (hb0["step"], hb0["phase"]) == (STEP, "optimizer")
    assert (hb1["step"], hb1["phase"]) == (STEP, "optimizer")
    # Flight Recorder: the waiting rank enqueued one collective more than the hung one and
    # never completed it; the hung rank has nothing pending.
    pg = next(pg for pg, n in _pending(hb0).items() if n > 0)
    assert hb0["collectives"][pg]["last_enqueued"] == hb1["collectives"][pg]["last_enqueued"] + 1
    assert _pending(hb1)[pg] == 0
    # The timed-out rank left its Flight Recorder trace where NCCL would (gloo does not).
    dump = pickle.loads((out / "flight_recorder" / "rank_0").read_bytes())
    seqs = [e["collective_seq_id"] for e in dump["entries"] if e["process_group"][0] == pg]
    assert max(seqs) == hb0["collectives"][pg]["last_enqueued"]


def test_mismatch_is_a_real_size_mismatch(tmp_path: Path) -> None:
    text, out = _run(tmp_path, "mismatch")
    assert f"mismatch: rank 1 all-reduces a different size at step {STEP}" in text
    # Both ranks entered the same all-reduce with different sizes: gloo detects it and aborts
    # the rank with the smaller buffer (no timeout involved).
    assert "SIGABRT" in text, text[-4000:]
    _assert_rows_before_fault(out)


def test_desync_skips_one_collective(tmp_path: Path) -> None:
    text, out = _run(tmp_path, "desync")
    assert f"desync: rank 1 skips the step {STEP} collective" in text
    # Rank 1's next collective (a step STEP+1 gradient bucket all-reduce) paired with rank 0's
    # step STEP loss all-reduce: a size mismatch gloo aborts on.
    assert "SIGABRT" in text, text[-4000:]
    _assert_rows_before_fault(out)


def test_slow_rank_is_slower_but_correct(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "slow", seconds=0.5)
    out = tmp_path / "run"
    assert_ok(torchrun(nproc=2, specs=[spec], out=out, extra=HB, timeout=120))
    got = metrics(out)
    # The sleeping rank holds every step from STEP on back by at least its sleep. The rows are
    # rank 0's: its step k's all-reduce cannot end before rank 1 has slept after the end of
    # step k-1's, so from rank 0's start of step STEP-1 (it takes part in that step's
    # all-reduce) to the end of the last step is at least one sleep a step from STEP on.
    # One step's own time says less: rank 1 sleeps while rank 0 is still between steps
    # (metrics, checkpoint), which on a loaded machine can take part of the sleep.
    by_step = {m["step"]: m for m in got}
    last = max(by_step)
    began = by_step[STEP - 1]["time"] - by_step[STEP - 1]["step_time_s"]
    assert by_step[last]["time"] - began >= 0.5 * (last - STEP + 1), got
    # ... and a straggler changes nothing numerically.
    assert_parity(got, reference(spec), min_steps=6, loss_atol=2e-5)


def test_user_hang_blocks_every_rank_outside_collectives(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = popen_torchrun(nproc=2, specs=[_spec(tmp_path, "user_hang", rank=0)], out=out,
                          extra=HB, log=tmp_path / "torchrun.log")
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                hbs = [heartbeat(out, r) for r in (0, 1)]
            except (FileNotFoundError, ValueError):
                hbs = []
            if hbs and all(h["step"] == STEP and h["phase"] == "data" for h in hbs):
                break
            assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()[-4000:]
            time.sleep(0.3)
        else:
            pytest.fail("ranks never reached the user hang")
        first = [heartbeat(out, r)["time"] for r in (0, 1)]
        # Well past the collective timeout nothing has failed: no collective is pending.
        time.sleep(3 * TIMEOUT_S)
        assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()[-4000:]
        for r in (0, 1):
            hb = heartbeat(out, r)
            assert (hb["step"], hb["phase"]) == (STEP, "data")
            assert hb["time"] > first[r]  # the side thread still reports
            assert all(n == 0 for n in _pending(hb).values()), json.dumps(hb)
        _assert_rows_before_fault(out)
    finally:
        kill_tree(proc)
