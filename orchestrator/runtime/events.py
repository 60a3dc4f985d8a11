"""The typed protocol between the control plane and an attempt's controller. Pure module.

Scheduler -> controller: one `AttemptConfig` (carries the validated `JobSpec` and the planned
bundles). Controller -> poller: `PollReply`s holding `ControllerEvent`s in sequence order,
each with one payload below, plus every rank's latest `RankStatus`.

    Placed            the gang reservation (placement group) is ready
    WorkersReady      the worker actors exist; ranks computed from where they landed
    FirstStep         the first training step finished (-> RUNNING)
    ProcessesStarted  user code: every rank's process runs (-> RUNNING)
    Metrics / Logs    rows and lines drained from the workers
    Usage             utilisation samples (CPU, memory, GPU) per rank, at a bounded rate
    Checkpoints       rank 0's completed checkpoints (step, path, size)
    Stacks            the answer to a "stacks now" request
    Diagnosis         a hang watchdog report
    WatchdogError     the watchdog itself failed (logged, never fatal)
    Succeeded | Cancelled | PlacementTimeout | Failed     how the attempt ended (terminal)

The Ray names the two sides find each other by are defined here too, with their parsers.

>>> controller_name("j1", 2), parse_controller_name("meshyard-ctrl-j1-2")
('meshyard-ctrl-j1-2', ('j1', 2))
>>> spare_controller_name("3f2a"), parse_controller_name("meshyard-spare-3f2a")
('meshyard-spare-3f2a', None)
>>> is_spare_controller_name("meshyard-spare-3f2a"), is_spare_controller_name("meshyard-ctrl-j1-2")
(True, False)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

from orchestrator.isolation.modes import JobConfinement
from orchestrator.lifecycle import RankState, Reason
from orchestrator.placement.gang_plan import Bundle
from orchestrator.placement.links import LinkFigures
from orchestrator.runtime.failures import Blame, FailureGroup
from orchestrator.spec import JobSpec, WatchdogAction
from orchestrator.storage.object_storage import ObjectStorage
from orchestrator.topology.model import ClusterTopology
from orchestrator.watchdog.report import DiagnosisReport

# -- Ray names ------------------------------------------------------------------------------
NAMESPACE = "meshyard"
POOL_NAME = "meshyard-pool"
_CONTROLLER_PREFIX = "meshyard-ctrl-"
_PG_PREFIX = "meshyard-pg-"
_SPARE_PREFIX = "meshyard-spare-"


def controller_name(job_id: str, attempt: int) -> str:
    return f"{_CONTROLLER_PREFIX}{job_id}-{attempt}"


def spare_controller_name(token: str) -> str:
    """A spare controller's name: started before any attempt needs it, it keeps this name
    when an attempt adopts it (the attempt's placement records which name it has)."""
    return f"{_SPARE_PREFIX}{token}"


def is_spare_controller_name(name: str) -> bool:
    return name.startswith(_SPARE_PREFIX) and len(name) > len(_SPARE_PREFIX)


def attempt_controller_name(job_id: str, attempt: int,
                            placement: dict[str, Any] | None) -> str:
    """The name of an attempt's controller, as its placement records it (`controller`);
    `controller_name(job, attempt)` for one that records none.

    >>> attempt_controller_name("j1", 2, {"controller": "meshyard-spare-3f2a"})
    'meshyard-spare-3f2a'
    >>> attempt_controller_name("j1", 2, {"bundles": []}), attempt_controller_name("j1", 2, None)
    ('meshyard-ctrl-j1-2', 'meshyard-ctrl-j1-2')
    """
    recorded = (placement or {}).get("controller")
    return recorded if isinstance(recorded, str) and recorded else \
        controller_name(job_id, attempt)


def pg_name(job_id: str, attempt: int) -> str:
    return f"{_PG_PREFIX}{job_id}-{attempt}"


def _parse(name: str, prefix: str) -> tuple[str, int] | None:
    if not name.startswith(prefix):
        return None
    job, _, attempt = name[len(prefix):].rpartition("-")
    return (job, int(attempt)) if attempt.isdigit() and job else None


def parse_controller_name(name: str) -> tuple[str, int] | None:
    """(job id, attempt) of a controller's actor name, None for any other name."""
    return _parse(name, _CONTROLLER_PREFIX)


def parse_pg_name(name: str) -> tuple[str, int] | None:
    """(job id, attempt) of an attempt's placement group name, None for any other name."""
    return _parse(name, _PG_PREFIX)


class AttemptPhase(StrEnum):
    """Where an attempt's controller is. It only moves forward:
    IDLE (a spare, no attempt) -> PLACING (waiting for the gang's placement group) ->
    STARTING (creating the workers, assigning ranks) -> RUNNING (ranks launched, supervised)
    -> STOPPING (cancelled or failed: stopping the ranks, collecting what they left) -> ENDED
    (its terminal event emitted). A success goes from RUNNING to ENDED."""

    IDLE = "idle"
    PLACING = "placing"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    ENDED = "ended"


PHASE_ORDER = tuple(AttemptPhase)


# -- scheduler -> controller ----------------------------------------------------------------
@dataclass(frozen=True)
class AttemptConfig:
    job_id: str
    attempt: int
    spec: JobSpec
    bundles: tuple[Bundle, ...]  # one per rank, in planned-rank order
    run_dir: str
    placement_timeout_s: float
    init_timeout_s: float
    cluster: ClusterTopology | None = None  # topology of the nodes used (GPU jobs)
    use_pool: bool = False  # lease warm actors (orchestrator/runtime/pool.py)
    fork_workers: bool = True  # cold actors forked by their node's workers/host/forkserver.py
    package_uri: str | None = None  # user code uploaded to Ray (runtime_env working_dir)
    usage_interval_s: float = 10.0  # one utilisation sample per rank this often, at most
    link_figures: LinkFigures | None = None  # calibrated figures (None: the defaults)
    # What user code's ranks are confined to (orchestrator/isolation/modes.py); None: nothing.
    confinement: JobConfinement | None = None
    # The job's checkpoint folder on the cluster's shared checkpoint storage, which every host
    # mounts; None: `<run_dir>/checkpoints`, on the disk of the host each rank runs on.
    checkpoint_dir: str | None = None
    # The cluster's checkpoint store (runtime/object_storage.py, with its keys): the hosts
    # upload the job's checkpoints there and download the newest before ranks start; the
    # ranks keep them under `<run_dir>/checkpoints`. None: no store.
    object_storage: ObjectStorage | None = None

    @property
    def checkpoint_root(self) -> str:
        return self.checkpoint_dir or f"{self.run_dir}/checkpoints"

    @property
    def pg_name(self) -> str:
        return pg_name(self.job_id, self.attempt)

    @property
    def log_dir(self) -> str:
        return f"{self.run_dir}/logs/attempt-{self.attempt}"

    @property
    def world_size(self) -> int:
        return len(self.bundles)


# -- controller -> poller: ranks -------------------------------------------------------------
@dataclass(frozen=True)
class RankStatus:
    """One rank as the controller knows it now. `node` is the topology's name of its node."""

    rank: int
    node: str | None = None
    node_id: str | None = None
    gpu: int | None = None
    coords: dict[str, int] = field(default_factory=dict)
    pid: int | None = None
    ip: str | None = None
    bundle: int | None = None
    state: RankState = RankState.STARTING
    step: int | None = None
    start_step: int = 0  # the checkpoint's step the rank resumed from (0: a fresh start)
    phase: str | None = None
    last_heartbeat: float | None = None  # the worker's own clock (unix seconds)
    # A script that reports no steps progresses by its collectives: the count its probe saw
    # enqueued, when the first was seen and when the count last grew (worker clock).
    collectives: int | None = None
    progress_first_at: float | None = None
    progress_at: float | None = None

    # What the store keeps of a rank (the poller writes a row when one of these changes).
    STORED: ClassVar[tuple[str, ...]] = ("node", "node_id", "gpu", "coords", "state", "step",
                                         "phase", "pid", "last_heartbeat", "collectives",
                                         "progress_first_at", "progress_at")

    def observed(self, **update: Any) -> RankStatus:
        """This rank with a drain's update; a grown collective count is progress, dated by
        the update's heartbeat."""
        new = replace(self, **update)
        count = new.collectives
        if count and count != self.collectives:
            at = new.last_heartbeat or time.time()
            new = replace(new, progress_at=at, progress_first_at=self.progress_first_at or at)
        return new

    def stored(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.STORED)


@dataclass(frozen=True)
class Master:
    """Rank 0's rendezvous address (MASTER_ADDR / MASTER_PORT)."""

    addr: str
    port: int


# -- controller -> poller: event payloads ----------------------------------------------------
class EventKind(StrEnum):
    PLACED = "placed"
    WORKERS_READY = "workers_ready"
    FIRST_STEP = "first_step"
    PROCESSES_STARTED = "processes_started"
    METRICS = "metrics"
    LOGS = "logs"
    USAGE = "usage"
    CHECKPOINTS = "checkpoints"
    STACKS = "stacks"
    DIAGNOSIS = "diagnosis"
    WATCHDOG_ERROR = "watchdog_error"
    LINK_GAP = "link_gap"
    SLOW_LINK = "slow_link"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    PLACEMENT_TIMEOUT = "placement_timeout"
    FAILED = "failed"


@dataclass(frozen=True)
class Placed:
    KIND: ClassVar[EventKind] = EventKind.PLACED
    waited_s: float


@dataclass(frozen=True)
class WorkersReady:
    KIND: ClassVar[EventKind] = EventKind.WORKERS_READY
    ranks: tuple[RankStatus, ...]
    master: Master


@dataclass(frozen=True)
class FirstStep:
    KIND: ClassVar[EventKind] = EventKind.FIRST_STEP
    step: int


@dataclass(frozen=True)
class ProcessesStarted:
    """User code: every rank's process is running (-> RUNNING without waiting for a report)."""

    KIND: ClassVar[EventKind] = EventKind.PROCESSES_STARTED
    pids: tuple[int, ...]


@dataclass(frozen=True)
class Metrics:
    KIND: ClassVar[EventKind] = EventKind.METRICS
    rows: tuple[dict[str, Any], ...]  # rank, step, loss, ... as the loop reported them


@dataclass(frozen=True)
class Logs:
    KIND: ClassVar[EventKind] = EventKind.LOGS
    lines: tuple[dict[str, Any], ...]  # rank, stream, line, time


@dataclass(frozen=True)
class Usage:
    KIND: ClassVar[EventKind] = EventKind.USAGE
    rows: tuple[dict[str, Any], ...]  # rank, node, at, cpu_percent, rss_bytes, gpu_* ...


@dataclass(frozen=True)
class Checkpoints:
    KIND: ClassVar[EventKind] = EventKind.CHECKPOINTS
    saved: tuple[dict[str, Any], ...]  # step, path, size_bytes, time, kept


@dataclass(frozen=True)
class Stacks:
    """Every rank's Python stacks for the "stacks now" request `request_id`: per rank,
    thread label -> stack text; ranks that did not answer are in `errors`."""

    KIND: ClassVar[EventKind] = EventKind.STACKS
    request_id: int
    ranks: dict[int, dict[str, str]]
    errors: dict[int, str] = field(default_factory=dict)
    error: str = ""  # why nothing was collected (no workers yet)
    native: dict[int, str] = field(default_factory=dict)  # per rank, py-spy's dump, if any


@dataclass(frozen=True)
class Diagnosis:
    KIND: ClassVar[EventKind] = EventKind.DIAGNOSIS
    report: DiagnosisReport
    trigger: str  # stall | silent | exit | straggler
    detected_at: float

    def __reduce__(self) -> tuple[Any, ...]:
        # The report holds read-only mappings that do not pickle; it travels as its dict.
        return (_diagnosis, (self.report.to_dict(), self.trigger, self.detected_at))


def _diagnosis(report: dict[str, Any], trigger: str, detected_at: float) -> Diagnosis:
    return Diagnosis(report=DiagnosisReport.from_dict(report), trigger=trigger,
                     detected_at=detected_at)


@dataclass(frozen=True)
class LinkGap:
    """A rank's worker answered no poll for `silent_s` while the other ranks did, then
    answered again (orchestrator/runtime/answer_gaps.py): training went on."""

    KIND: ClassVar[EventKind] = EventKind.LINK_GAP
    rank: int
    node: str | None
    host: str | None
    silent_s: float


@dataclass(frozen=True)
class SlowLink:
    """Steps took `slower` times as long as the attempt's first ones while no rank straggled,
    and the link of host `host` (node `node`), measured from the control plane's node, gave
    `gbps` where the gang's other hosts gave `others_gbps` (runtime/link_probe.py). `link`:
    the class of the links between the gang's hosts (the pre-flight check's name)."""

    KIND: ClassVar[EventKind] = EventKind.SLOW_LINK
    node: str
    host: str
    gbps: float
    others_gbps: float
    slower: float
    link: str


@dataclass(frozen=True)
class WatchdogError:
    KIND: ClassVar[EventKind] = EventKind.WATCHDOG_ERROR
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class Succeeded:
    KIND: ClassVar[EventKind] = EventKind.SUCCEEDED


@dataclass(frozen=True)
class Cancelled:
    KIND: ClassVar[EventKind] = EventKind.CANCELLED
    message: str = ""


@dataclass(frozen=True)
class PlacementTimeout:
    KIND: ClassVar[EventKind] = EventKind.PLACEMENT_TIMEOUT
    message: str
    waited_s: float


@dataclass(frozen=True)
class Failed:
    """The attempt failed. `hang_action` is set when the hang watchdog ended it: FAIL ends the
    job, RESTART counts as a failed attempt (with `avoid_nodes` kept out of the next one)."""

    KIND: ClassVar[EventKind] = EventKind.FAILED
    reason: Reason
    message: str
    groups: tuple[FailureGroup, ...] = ()
    failed_nodes: tuple[str, ...] = ()
    avoid_nodes: tuple[str, ...] = ()
    hang_action: WatchdogAction | None = None
    blame: Blame = Blame.INFRA  # what the cause points at (failures.blame)
    retry_matched: bool = False  # a USER failure that `fault_tolerance.retry_on` names
    # Ray node ids of the ranks cut off from the controller when the attempt ended: their
    # files are not asked for again (metrics recovery would wait out its timeout on them)
    unreachable_nodes: tuple[str, ...] = ()


Payload = (Placed | WorkersReady | FirstStep | ProcessesStarted | Metrics | Logs | Usage
           | Checkpoints | Stacks | Diagnosis | LinkGap | SlowLink | WatchdogError | Succeeded
           | Cancelled | PlacementTimeout | Failed)
Terminal = Succeeded | Cancelled | PlacementTimeout | Failed


@dataclass(frozen=True)
class ControllerEvent:
    seq: int
    payload: Payload
    time: float = field(default_factory=time.time)

    @property
    def kind(self) -> EventKind:
        return self.payload.KIND

    @property
    def terminal(self) -> bool:
        return isinstance(self.payload, Terminal)


@dataclass(frozen=True)
class PollReply:
    events: tuple[ControllerEvent, ...]
    ranks: tuple[RankStatus, ...]
    seq: int
    outcome: EventKind | None
    job_id: str
    attempt: int
    phase: AttemptPhase = AttemptPhase.IDLE
