"""What the runtime hands one worker actor, and what the worker hands back. Pure module.

The attempt's controller (`orchestrator.runtime.gang`) computes the ranks from where the actors
landed, then calls `WorkerActor.run(RankAssignment)` on each; the actor answers `poll()` with a
`WorkerPoll` while it trains and `run` returns a `RankResult`. Everything here is a frozen value
that pickles across Ray as is: the spec is the validated `JobSpec`, never a dict.

    RankAssignment(job_id="j1", attempt=1, rank=3, spec=spec, run_dir="/runs/j1",
                   log_dir="/runs/j1/logs/attempt-1",
                   dist=DistEnv(rank=3, local_rank=1, world_size=4, local_world_size=2,
                                master_addr="10.0.0.1", master_port=29500))
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from orchestrator.isolation.modes import JobConfinement
from orchestrator.preflight.verdict import ExpectedLink
from orchestrator.spec import JobSpec, SpecKind


class WorkerState(StrEnum):
    """A worker actor's own state; the controller reports it upper-cased as the rank's state."""

    IDLE = "idle"
    RUNNING = "running"
    COMPLETED = "completed"
    STOPPED = "stopped"
    ERROR = "error"


@dataclass(frozen=True)
class DistEnv:
    """The torch.distributed coordinates of one rank (torchrun's RANK, LOCAL_RANK, ...)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        """Reads torchrun-style variables; a missing RANK means a single process."""
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=world,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
        )

    @classmethod
    def single(cls) -> DistEnv:
        return cls(rank=0, local_rank=0, world_size=1, local_world_size=1,
                   master_addr="127.0.0.1", master_port=0)

    def as_kwargs(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RankAssignment:
    job_id: str
    attempt: int
    rank: int
    spec: JobSpec
    run_dir: str
    log_dir: str
    dist: DistEnv
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables for this rank
    node_rank: int = 0  # this node's index among the job's nodes (torchrun's GROUP_RANK)
    num_nodes: int = 1
    local_gpus: tuple[int, ...] = ()  # GPU ids of this node's ranks, in local-rank order
    # A pooled actor's GPUs (its bundle's, which Ray did not assign to it: it was created
    # before the job); it sets CUDA_VISIBLE_DEVICES to them as Ray does for a cold actor.
    # None: Ray's own assignment stands.
    visible_gpus: tuple[int, ...] | None = None
    # A pooled actor's uploaded code (`gcs://` URI): it was created without the job's Ray
    # working_dir, so it unpacks the package itself (workers/usercode/rank.py). None: Ray did.
    package_uri: str | None = None
    # The pre-flight check's expected figure per group this rank tests and the pair into it,
    # per backend ("gloo", "nccl": the rank picks the one it runs; a GPU bundle can run gloo
    # when CUDA is absent); empty: the links are compared with each other only.
    preflight_links: Mapping[str, Mapping[str, ExpectedLink]] = field(default_factory=dict)
    # User code: the pre-flight check's own rendezvous port on MASTER_ADDR (None: no check).
    preflight_port: int | None = None
    # User code: what its rank process is confined to (orchestrator/isolation/modes.py; the node
    # adds Ray's share, workers/host/confinement.py); None: not confined.
    confinement: JobConfinement | None = None
    # The job's checkpoints on shared storage (AttemptConfig.checkpoint_dir); None: under the
    # run dir.
    checkpoint_dir: str | None = None
    # User code whose ranks landed on several hosts with checkpoints on host-local disks: why
    # a reported checkpoint cannot be kept (runtime/checkpoint_storage.py); None: it can.
    checkpoints_refused: str | None = None
    # The cluster's checkpoint store's address (s3://...; no keys: the ranks never reach it):
    # a restart resumes from what is complete there. None: no store.
    checkpoint_store: str | None = None

    @property
    def runs_user_preflight(self) -> bool:
        return (self.spec.kind is SpecKind.USER_CODE and self.spec.preflight.enabled
                and self.dist.world_size > 1 and bool(self.preflight_port))

    @property
    def checkpoint_root(self) -> str:
        return self.checkpoint_dir or str(Path(self.run_dir) / "checkpoints")

    def log_path(self, suffix: str) -> Path:
        return rank_log_path(self.log_dir, self.rank, suffix)


def rank_log_path(log_dir: str, rank: int, suffix: str) -> Path:
    """`<log_dir>/rank-<r>.<suffix>` (suffix stdout, stderr, log or metrics.jsonl)."""
    return Path(log_dir) / f"rank-{rank}.{suffix}"


@dataclass(frozen=True)
class RankResult:
    """How one rank's run ended. `time` is when the controller saw it end."""

    rank: int
    state: WorkerState  # COMPLETED, STOPPED or ERROR
    last_step: int | None = None
    seconds: float = 0.0
    error_type: str | None = None
    message: str = ""
    traceback: str = ""
    time: float | None = None
    result: Any = None  # what the training function returned, made JSON-able
    exit_code: int | None = None  # user code: the rank process's exit status (-N: signal N)
    setup_error: bool = False  # user code that could not even be loaded (not restarted)

    @property
    def failed(self) -> bool:
        return self.state == WorkerState.ERROR


@dataclass(frozen=True)
class RankBeat:
    """One rank's latest heartbeat, as its worker reports it in a poll. `step` is the step
    being run (0 during setup), `start_step` the step the attempt resumed from; `collectives`
    the collective sequence numbers per process group (`collective_count`: their total, when
    the rank's probe counts them: user code)."""

    rank: int
    step: int
    phase: str
    time: float
    phase_since: float
    pid: int
    start_step: int = 0
    collectives: Mapping[str, Any] = field(default_factory=dict)
    collective_count: int | None = None

    @classmethod
    def of(cls, hb: Any) -> RankBeat:
        """From the training loop's `Heartbeat` (workers.loop.callbacks)."""
        return cls(rank=int(hb.rank), step=int(hb.step), phase=str(getattr(hb.phase, "value",
                   hb.phase)), time=float(hb.time), phase_since=float(hb.phase_since),
                   pid=int(hb.pid), start_step=int(hb.start_step),
                   collectives={k: asdict(v) if hasattr(v, "__dataclass_fields__") else v
                                for k, v in dict(hb.collectives).items()})

    @property
    def running_step(self) -> int | None:
        """The step the rank is in, or None during setup."""
        return self.step if self.step > 0 else None


@dataclass(frozen=True)
class WorkerPoll:
    """What a worker reports since the last poll: metrics rows, log lines, its heartbeat, a
    utilisation sample (workers.host.sampling; None between samples) and completed checkpoints."""

    state: WorkerState
    metrics: tuple[dict[str, Any], ...] = ()
    logs: tuple[dict[str, Any], ...] = ()
    heartbeat: RankBeat | None = None
    last_step: int | None = None
    dropped_logs: int = 0
    usage: dict[str, Any] | None = None
    checkpoints: tuple[dict[str, Any], ...] = ()
