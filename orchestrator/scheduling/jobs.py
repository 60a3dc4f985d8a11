"""The scheduling policy's inputs: a queued job and a running job, without the store. Pure."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from orchestrator.placement.gang_plan import GangPlan, Pending
from orchestrator.placement.snapshot import ClusterSnapshot


@dataclass(frozen=True)
class QueuedJob:
    id: str
    priority: int
    submitted_at: float  # epoch seconds (the wait that aging counts starts here)
    gpus: int  # GPUs the gang needs
    est_runtime_s: float | None = None  # None: no estimate, so it never backfills a reservation
    owner: str = ""
    seq: int = 0  # submission order (ties)
    shape: Hashable = None  # jobs with the same non-None shape plan alike (a pass memo key)


@dataclass(frozen=True)
class RunningJob:
    id: str
    priority: int
    gpus_by_node: Mapping[str, tuple[int, ...]]  # node name -> GPU indices it holds
    started_at: float  # when its current attempt started
    est_end: float | None = None  # remaining steps x measured step time (or max runtime)
    last_checkpoint_at: float | None = None  # its last saved checkpoint (None: none yet)
    preemptible: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus_by_node", MappingProxyType(
            {n: tuple(sorted(g)) for n, g in self.gpus_by_node.items() if g}))

    @property
    def gpus(self) -> int:
        return sum(len(g) for g in self.gpus_by_node.values())

    def lost_work_s(self, now: float) -> float:
        """GPU-seconds computed since its last checkpoint (or since this attempt started,
        when that is later): what stopping it now throws away."""
        since = max(self.started_at, self.last_checkpoint_at or self.started_at)
        return self.gpus * max(0.0, now - since)


# plan(job, snapshot): the gang's plan on that snapshot, or why it does not fit
Planner = Callable[[QueuedJob, ClusterSnapshot], GangPlan | Pending]
