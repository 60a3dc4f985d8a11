"""The per-attempt controller: one detached, named Ray actor per job attempt.

It outlives the control plane (detached), so a restarted control plane reattaches to it by
name and resumes polling from the cursor it stored. The name is recorded in the attempt's
placement (`placement["controller"]`): a spare controller started ahead of time
(runtime/spares.py, `events.spare_controller_name`) keeps its own name when an attempt
adopts it; a controller started for the attempt is `events.controller_name(job, attempt)`,
which is also the name of an attempt that records none. Both live in namespace `meshyard`.
The controller never writes the database: it appends typed events
(`orchestrator.runtime.events`) to an in-memory log with increasing sequence numbers; the
control plane reads them with `poll(after=cursor)`, writes them, stores the cursor, then
`ack`s so the controller may drop them. Nothing is dropped before it is acknowledged, so
nothing is lost.

Attempt flow (thread `_run`):
  wait for the placement group (timeout -> PlacementTimeout)
  -> create one WorkerActor per bundle -> read the (node id, GPU id) each got -> assign ranks
  -> MASTER_ADDR/PORT on rank 0's node -> run -> forward metrics / logs / heartbeats
  -> Succeeded | Failed (grouped errors) | Cancelled.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.lifecycle import RankState, Reason
from orchestrator.preflight import culprits_of
from orchestrator.runtime.events import (
    NAMESPACE,
    AttemptConfig,
    Cancelled,
    Checkpoints,
    ControllerEvent,
    Failed,
    FirstStep,
    Logs,
    Metrics,
    Payload,
    Placed,
    PlacementTimeout,
    PollReply,
    ProcessesStarted,
    RankStatus,
    Stacks,
    Succeeded,
    Terminal,
    Usage,
    WorkersReady,
    attempt_controller_name,
    controller_name,
)
from orchestrator.runtime.failures import (
    FailureGroup,
    RankFailure,
    attempt_failed,
    group_failures,
)
from orchestrator.runtime.gang import Drained, WorkerGang
from orchestrator.runtime.hangwatch import AttemptWatchdog
from orchestrator.runtime.user_checkpoints import ReportedCheckpoints
from orchestrator.watchdog.report import DiagnosisReport

_TICK_S = 0.25
_STOP_GRACE_S = 2.0
_USER_STOP_GRACE_S = 5.0  # the rank process gets SIGTERM, then SIGKILL after 3 s
_FINAL_STATE = {Succeeded: RankState.SUCCEEDED, Failed: RankState.FAILED,
                Cancelled: RankState.CANCELLED}


class _EventLog:
    """Append-only, acknowledged event log (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[ControllerEvent] = []
        self._seq = 0

    def emit(self, payload: Payload) -> None:
        with self._lock:
            self._seq += 1
            self._events.append(ControllerEvent(seq=self._seq, payload=payload))

    def after(self, cursor: int, limit: int) -> tuple[ControllerEvent, ...]:
        with self._lock:
            return tuple(e for e in self._events if e.seq > cursor)[:limit]

    def ack(self, cursor: int) -> None:
        with self._lock:
            self._events = [e for e in self._events if e.seq > cursor]

    @property
    def seq(self) -> int:
        return self._seq


class AttemptController:
    """Runs one attempt. Methods other than the run thread are quick and thread-safe."""

    def __init__(self, config: AttemptConfig | None = None) -> None:
        """Without a config: a spare, idle until `adopt` gives it an attempt."""
        self.log = _EventLog()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._outcome: Terminal | None = None
        self._ranks: dict[int, RankStatus] = {}
        self._ranks_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._gang: WorkerGang | None = None
        self._adopt_lock = threading.Lock()
        self.cfg: AttemptConfig | None = None
        if config is not None:
            self._configure(config)

    def _configure(self, config: AttemptConfig) -> None:
        self._user_code = config.spec.entrypoint is not None
        self._checkpoints = ReportedCheckpoints(
            root=Path(config.run_dir) / "checkpoints", world_size=config.world_size,
            attempt=config.attempt) if self._user_code else None
        self.cfg = config

    @property
    def config(self) -> AttemptConfig:
        assert self.cfg is not None, "a spare controller has no attempt"
        return self.cfg

    # -- control-plane API ------------------------------------------------------------------
    def adopt(self, config: AttemptConfig) -> bool:
        """A spare takes its attempt and starts it; False if it already has one."""
        with self._adopt_lock:
            if self.cfg is not None:
                return False
            self._configure(config)
        return self.start()

    def start(self) -> bool:
        if self.cfg is None:
            return False  # a spare: nothing to run yet
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="attempt", daemon=True)
            self._thread.start()
        return True

    def poll(self, after: int = 0, limit: int = 500) -> PollReply:
        with self._ranks_lock:
            ranks = tuple(self._ranks.values())
        outcome = self._outcome.KIND if self._outcome is not None else None
        cfg = self.cfg
        return PollReply(events=self.log.after(after, limit), ranks=ranks, seq=self.log.seq,
                         outcome=outcome, job_id=cfg.job_id if cfg else "",
                         attempt=cfg.attempt if cfg else 0)

    def ack(self, cursor: int) -> None:
        self.log.ack(cursor)

    def cancel(self, timeout_s: float = 8.0) -> str | None:
        """Stops the workers (gracefully, then by force) and returns the outcome."""
        self._cancel.set()
        self._done.wait(timeout_s)
        return self.outcome()

    def outcome(self) -> str | None:
        return self._outcome.KIND.value if self._outcome is not None else None

    def collect_stacks(self, request_id: int, timeout_s: float = 10.0) -> bool:
        """"Stacks now": every rank's Python stacks through the watchdog's diagnostics path,
        collected on a thread of its own; the answer is a `Stacks` event."""
        threading.Thread(target=self._collect_stacks, args=(request_id, timeout_s),
                         name=f"stacks-{request_id}", daemon=True).start()
        return True

    def _collect_stacks(self, request_id: int, timeout_s: float) -> None:
        gang = self._gang
        if gang is None:
            self.log.emit(Stacks(request_id=request_id, ranks={},
                                 error="the workers are not running yet"))
            return
        replies = gang.diagnostics(request={"kind": "stacks"}, timeout_s=timeout_s)
        ranks = {r: dict(x["stacks"]) for r, x in replies.items()
                 if isinstance(x, dict) and isinstance(x.get("stacks"), dict)}
        errors = {r: str(x.get("error", "no stacks in the answer"))[:500]
                  for r, x in replies.items() if r not in ranks and isinstance(x, dict)}
        errors.update({r: "its process is gone" for r in gang.ranks if r not in replies})
        self.log.emit(Stacks(request_id=request_id, ranks=ranks, errors=errors))

    def diagnostics(self, stamp: str | None = None, timeout_s: float = 10.0) -> dict[int, Any]:
        """Per-rank evidence from every worker's diagnostics group (for the hang watchdog;
        answered while the training threads are blocked). `stamp` names the shared folder."""
        gang = self._gang
        if gang is None:
            return {}
        return gang.diagnostics(request={"stamp": stamp}, timeout_s=timeout_s)

    # -- attempt thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._attempt()
        except Exception as exc:  # noqa: BLE001 - any controller bug fails the attempt visibly
            if self._gang is not None:
                self._gang.kill()
            sig = f"{type(exc).__name__}: {exc}"
            group = FailureGroup(signature=sig, ranks=(), nodes=(), example=str(exc),
                                 traceback=traceback.format_exc()[-4000:])
            self._finish(Failed(reason=Reason.INTERNAL_ERROR, message=f"controller error: {sig}",
                                groups=(group,)))

    def _attempt(self) -> None:
        if not self._wait_for_placement():
            return
        self._gang = gang = WorkerGang(self.config, cancel=self._cancel)
        ranks = gang.create()
        if ranks is None:  # cancelled while creating
            gang.kill()
            self._finish(Cancelled(message="cancelled while starting workers"))
            return
        with self._ranks_lock:
            self._ranks = {r.rank: r for r in ranks}
        self.log.emit(WorkersReady(ranks=ranks, master=gang.master))
        gang.launch()
        self._supervise(gang)

    def _wait_for_placement(self) -> bool:
        cfg = self.config
        pg = ray.util.get_placement_group(cfg.pg_name)
        ready = pg.ready()
        deadline = time.monotonic() + cfg.placement_timeout_s
        t0 = time.monotonic()
        while True:
            done, _ = ray.wait([ready], timeout=_TICK_S)
            if done:
                self.log.emit(Placed(waited_s=round(time.monotonic() - t0, 3)))
                return True
            if self._cancel.is_set():
                self._finish(Cancelled(message="cancelled while waiting for placement"))
                return False
            if time.monotonic() > deadline:
                self._finish(PlacementTimeout(
                    waited_s=cfg.placement_timeout_s,
                    message=f"gang reservation of {cfg.world_size} bundles not ready after "
                    f"{cfg.placement_timeout_s:g} s"))
                return False

    def _supervise(self, gang: WorkerGang) -> None:
        first_step = started = False
        grace = _USER_STOP_GRACE_S if self._user_code else _STOP_GRACE_S
        watch = AttemptWatchdog(self.config, emit=self.log.emit)
        while True:
            finished = gang.wait(timeout_s=_TICK_S)
            drained = gang.drain()
            self._forward(drained)
            if self._user_code and not started and gang.all_beating():
                started = True
                self.log.emit(ProcessesStarted(pids=gang.pids()))
            if not first_step and gang.last_steps():
                first_step = True
                self.log.emit(FirstStep(step=min(gang.last_steps().values())))
            if self._cancel.is_set():
                gang.stop_all(grace_s=grace)
                self._forward(gang.drain())
                gang.kill()
                self._finish(Cancelled(message="workers stopped on request"))
                return
            failures = gang.failures()
            if failures:
                gang.settle(timeout_s=1.0)  # a death the peers' errors report shows up too
                watch.on_failures(gang, gang.failures())  # peers left waiting: diagnose
                gang.stop_all(grace_s=max(grace, 3.0))
                self._forward(gang.drain())
                failures = gang.failures()  # fallout from other ranks joins the groups
                gang.kill()
                self._fail(failures, cause=watch.open_report, gang=gang)
                return
            if finished and gang.all_done():
                self._forward(gang.drain())
                gang.kill(succeeded=True)
                self._finish(Succeeded())
                return
            act = watch.tick(gang, drained)
            if act is not None:  # watchdog.action restart | fail: the hung workers are killed
                gang.kill()
                self._finish(act)
                return

    def _forward(self, drained: Drained) -> None:
        if drained.metrics:
            if self._checkpoints is not None:
                self._checkpoints.observe(drained.metrics)
            self.log.emit(Metrics(rows=drained.metrics))
        if drained.logs:
            self.log.emit(Logs(lines=drained.logs))
        if drained.usage:
            self.log.emit(Usage(rows=drained.usage))
        if drained.checkpoints:
            self.log.emit(Checkpoints(saved=drained.checkpoints))
        if drained.ranks:
            with self._ranks_lock:
                for rank, upd in drained.ranks.items():
                    self._ranks[rank] = replace(self._ranks.get(rank, RankStatus(rank=rank)),
                                                **upd)

    def _fail(self, failures: list[RankFailure], *, cause: DiagnosisReport | None,
              gang: WorkerGang | None = None) -> None:
        """A pre-flight failure (every rank raised PreflightFailed) names the culprit ranks'
        nodes and link class and is avoided by the next attempt.
        The attempt failed; its reason and message come from the open diagnosis when
        there is one (a hang, a rank's exit), else from the first rank to die or fail.
        User code that could not even load fails the same way on every attempt: it is a
        setup error and names no node as bad."""
        preflight = preflight_failure(failures, gang=gang, cfg=self.config)
        if preflight is not None:
            self._finish(preflight)
            return
        failed = attempt_failed(failures, cause)
        setup = bool(failures) and all(f.setup_error for f in failures)
        failed_nodes = () if setup else tuple(
            sorted({n for grp in failed.groups[:1] for n in grp.nodes}))
        self._finish(Failed(reason=Reason.SETUP_ERROR if setup else failed.reason,
                            message=failed.message, groups=failed.groups,
                            failed_nodes=failed_nodes))

    def _finish(self, outcome: Terminal) -> None:
        final = _FINAL_STATE.get(type(outcome))
        with self._ranks_lock:
            if final is not None:
                for r, status in self._ranks.items():
                    if status.state != RankState.FAILED:
                        self._ranks[r] = replace(status, state=final)
        self.log.emit(outcome)
        self._outcome = outcome
        self._done.set()


def preflight_failure(failures: list[RankFailure], *, gang: WorkerGang | None,
                      cfg: AttemptConfig) -> Failed | None:
    """The attempt's end when its ranks failed the pre-flight check, else None."""
    checks = [f for f in failures if f.error_type == "PreflightFailed"]
    if not checks or len(checks) < len(failures):
        return None
    message = checks[0].message
    culprits = culprits_of(message)
    where = {r: (gang.ranks[r].node, gang.ranks[r].gpu) for r in gang.ranks} \
        if gang is not None else {}
    nodes = tuple(sorted({str(where[r][0]) for r in culprits if r in where and where[r][0]}))
    peers = {str(n) for n, _ in where.values() if n}
    detail = f" (culprit{'s' if len(culprits) != 1 else ''} " + ", ".join(
        f"rank {r} on {where[r][0]}" + (f" GPU {where[r][1]}" if where[r][1] is not None
                                          else "") for r in culprits if r in where) + \
        f"; the gang spans {len(peers)} node(s))" if culprits else ""
    return Failed(reason=Reason.PREFLIGHT_FAILED, message=f"{message}{detail}",
                  groups=tuple(group_failures(failures)), failed_nodes=nodes,
                  avoid_nodes=nodes)


RemoteController: Any = ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_concurrency=16, max_restarts=0)(AttemptController)


def controller_options(name: str, near_node_id: str | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "lifetime": "detached"}
    if near_node_id:
        # Keep controllers next to the control plane (the head): losing a worker node must
        # not take the controller with it.
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(near_node_id, soft=True)
    return opts


def launch_controller(config: AttemptConfig, *, near_node_id: str | None = None,
                      spare: Any | None = None, adopt_timeout_s: float = 30.0) -> Any:
    """Starts the controller of one attempt: `spare` (a spare controller's handle) adopts
    it, else a new detached actor named `controller_name(job, attempt)` is created."""
    if spare is not None:
        if not ray.get(spare.adopt.remote(config), timeout=adopt_timeout_s):
            raise RuntimeError("the spare controller already runs an attempt")
        return spare
    opts = controller_options(controller_name(config.job_id, config.attempt), near_node_id)
    handle = RemoteController.options(**opts).remote(config)
    handle.start.remote()
    return handle


def recorded_controller_name(store: Any, job_id: str, attempt: int) -> str:
    """The name `store`'s record of the attempt gives its controller."""
    placement = next((a.placement for a in store.list_attempts(job_id) if a.number == attempt),
                     None)
    return attempt_controller_name(job_id, attempt, placement)


def find_controller(job_id: str, attempt: int, name: str | None = None) -> Any | None:
    """The attempt's controller (`name`: the one its placement records), None if gone."""
    try:
        return ray.get_actor(name or controller_name(job_id, attempt), namespace=NAMESPACE)
    except ValueError:
        return None
