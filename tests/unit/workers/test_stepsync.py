"""The loop's batched loss / stop sync (workers/loop/stepsync.py) in one process (world 1)."""

from __future__ import annotations

import pytest
import torch

from orchestrator.spec import FaultKind, InjectFault
from workers.host.faults import FaultInjector
from workers.loop.stepsync import MAX_INTERVAL, StepSync


def _sync(fault: InjectFault | None = None, *, world: int = 1) -> StepSync:
    return StepSync(world=world, device=torch.device("cpu"),
                    faults=FaultInjector(fault, rank=0))


@pytest.mark.timeout(30)
def test_rows_get_their_own_loss_and_the_interval_follows_step_time() -> None:
    sync = _sync()
    for step, loss in ((1, 4.0), (2, None), (3, 2.0)):
        sync.add({"step": step, "step_time_s": 0.01}, None if loss is None else
                 torch.tensor(loss))
    rows, stop = sync.flush(3, stop=False)
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 4.0), (2, 0.0), (3, 2.0)]
    assert not stop
    assert sync.interval == min(MAX_INTERVAL, 50)  # 0.5 s / 10 ms, capped
    sync.add({"step": 4, "step_time_s": 1.0}, torch.tensor(1.0))
    rows, stop = sync.flush(4, stop=True)
    assert stop and sync.interval == 1  # long steps sync every step


@pytest.mark.timeout(30)
def test_due_on_first_last_interval_and_fault_steps() -> None:
    assert _sync().due(2, first=False, last=False)  # one process: every step
    # world 2: due() needs no process group (only flush() runs the collective)
    sync = _sync(InjectFault(kind=FaultKind.HANG, rank=1, step=7), world=2)
    sync.interval = 4
    sync.add({"step": 2, "step_time_s": 0.01}, torch.tensor(1.0))
    assert sync.due(2, first=True, last=False)
    assert sync.due(2, first=False, last=True)
    assert not sync.due(2, first=False, last=False)
    # rank 0 is not the faulty rank, but it must join the collective the fault strikes
    assert sync.due(7, first=False, last=False)
    for s in (3, 4, 5):
        sync.add({"step": s, "step_time_s": 0.01}, torch.tensor(1.0))
    assert sync.due(5, first=False, last=False)
    crash = _sync(InjectFault(kind=FaultKind.CRASH, rank=0, step=7), world=2)
    crash.interval = 4
    crash.add({"step": 7, "step_time_s": 0.01}, torch.tensor(1.0))
    assert not crash.due(7, first=False, last=False)  # a crash is not in the collective


@pytest.mark.parametrize("kind", [FaultKind.HANG, FaultKind.NIC_HANG, FaultKind.DESYNC,
                                  FaultKind.MISMATCH])
def test_every_fault_of_the_loops_collective_makes_its_step_a_sync_step(kind: FaultKind) -> None:
    """A fault that strikes in the loop's collective (FaultInjector.before_collective) never
    fires unless its step syncs."""
    sync = _sync(InjectFault(kind=kind, rank=1, step=7), world=2)
    sync.interval = 32
    sync.add({"step": 7, "step_time_s": 0.01}, torch.tensor(1.0))
    assert sync.due(7, first=False, last=False)
