"""The loop's own collective: the global mean loss and the stop vote, batched over steps.

Every rank keeps each finished step's metrics row and its local loss (a detached tensor: no
host sync) and, on a sync step, all-reduces one vector over the world::

    [loss sum of each pending step..., count of each pending step..., stop votes, proposal]

so every pending row gets the global mean loss (the same on every rank, whatever the layout:
non-last pipeline stages count zero) and, when any rank asked to stop, every rank stops after
the same step. One all-reduce of a few floats costs a rank about a millisecond of CPU on gloo
(two thread hand-offs and a TCP round trip), a measurable part of a short step; batching pays
it once per ``interval`` steps instead.

Sync steps are the same on every rank (a single process syncs every step): the first step,
the last step, any step where a fault is injected into this collective, and otherwise every
``interval`` steps. The interval is agreed in the collective itself: each rank proposes how
many of its recent steps fit in ``target_s`` (1 to ``max_interval``) and every rank takes the
same mean of the proposals, so a cancel takes effect within about ``target_s`` of training
and a metrics row is at most that late. Long steps sync every step. A step's row is also kept
when the step is done (the loop's ``on_step_pending``: the worker actor's run-dir file, without
the loss), so a rank that dies before the next sync loses none of its steps; the heartbeat's
step shows progress in between.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from workers.host.evidence import announce_step_collective
from workers.host.faults import MISMATCH_NUMEL, CollectiveAction, FaultInjector

TARGET_S = 0.5
MAX_INTERVAL = 32


@dataclass
class StepSync:
    world: int
    device: torch.device
    faults: FaultInjector
    target_s: float = TARGET_S
    max_interval: int = MAX_INTERVAL
    interval: int = 1
    _rows: list[dict[str, Any]] = field(default_factory=list)
    _losses: list[torch.Tensor | None] = field(default_factory=list)

    def add(self, row: dict[str, Any], loss: torch.Tensor | None) -> None:
        """Keeps a finished step's metrics row (without ``loss``) and its local mean loss."""
        self._rows.append(row)
        self._losses.append(loss)

    def due(self, step: int, *, first: bool, last: bool) -> bool:
        # One process has no collective to save: every step syncs.
        return (self.world == 1 or first or last or len(self._rows) >= self.interval
                or self.faults.in_step_collective(step))

    def flush(self, step: int, *, stop: bool) -> tuple[list[dict[str, Any]], bool]:
        """Reduces the pending steps -> (their rows with the global mean ``loss``, whether any
        rank asked to stop). The fault-injection point of the loop's collective."""
        n = len(self._rows)
        zero = torch.zeros((), device=self.device)
        losses = torch.stack([zero if x is None else x.detach().float().reshape(())
                              for x in self._losses])
        tail = [0.0 if x is None else 1.0 for x in self._losses]
        tail += [float(stop), self._proposal()]
        vals = torch.cat([losses, torch.tensor(tail, device=self.device)])
        if self.world > 1:
            action = self.faults.before_collective(step)
            if action == CollectiveAction.MISMATCH:
                vals = torch.zeros(MISMATCH_NUMEL, device=self.device)
            if action != CollectiveAction.SKIP:
                # gloo SIGABRTs a rank on a size mismatch: the announced op is its evidence.
                announce_step_collective("all_reduce", vals)
                dist.all_reduce(vals)
        host = vals[:2 * n + 2].tolist()
        rows = self._rows
        for i, row in enumerate(rows):
            row["loss"] = host[i] / max(host[n + i], 1.0)
        votes, proposals = host[2 * n], host[2 * n + 1]
        self.interval = max(1, min(self.max_interval, int(proposals / self.world)))
        self._rows, self._losses = [], []
        return rows, votes > 0

    def _proposal(self) -> float:
        times = [r["step_time_s"] for r in self._rows if "step_time_s" in r]
        if not times:
            return 1.0
        per_step = sum(times) / len(times)
        fit = int(self.target_s / per_step) if per_step > 0 else self.max_interval
        return float(max(1, min(self.max_interval, fit)))
