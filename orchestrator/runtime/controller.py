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

from orchestrator.isolation.runfiles import checkpoint_place
from orchestrator.lifecycle import RankState, Reason
from orchestrator.runtime.attempt_outcome import failed_outcome
from orchestrator.runtime.checkpoint_seed import SeedError, seed_checkpoint
from orchestrator.runtime.checkpoint_storage import host_local_checkpoints
from orchestrator.runtime.checkpoint_uploads import CheckpointUploads
from orchestrator.runtime.checkpoint_uploads import restore as restore_checkpoint
from orchestrator.runtime.events import (
    NAMESPACE,
    PHASE_ORDER,
    AttemptConfig,
    AttemptPhase,
    Cancelled,
    Checkpoints,
    ControllerEvent,
    Failed,
    FirstStep,
    LinkGap,
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
from orchestrator.runtime.failures import Blame, FailureGroup, rank_end_states
from orchestrator.runtime.gang import Drained, WorkerGang
from orchestrator.runtime.hangwatch import AttemptWatchdog
from orchestrator.runtime.link_probe import locate_slow_end
from orchestrator.runtime.user_checkpoints import ReportedCheckpoints
from orchestrator.spec import SpecKind
from orchestrator.storage.object_storage import ObjectStorage, StorageError

_TICK_S = 0.25
_STOP_GRACE_S = 2.0
_USER_STOP_GRACE_S = 5.0  # the rank process gets SIGTERM, then SIGKILL after 3 s
# How long an ending attempt waits for its hosts' checkpoint uploads (a cut-off host's are
# given up at once): a failed or stopped attempt, and a finished one (its final checkpoint).
_END_UPLOADS_S = 60.0
_FINAL_UPLOADS_S = 600.0
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


def _no_marker(directory: Path, info: dict[str, Any]) -> None:
    """User code's checkpoints with a checkpoint store: the marker is written there."""


class AttemptController:
    """Runs one attempt. Methods other than the run thread are quick and thread-safe."""

    def __init__(self, config: AttemptConfig | None = None) -> None:
        """Without a config: a spare, idle until `adopt` gives it an attempt."""
        self.log = _EventLog()
        self._cancel = threading.Event()
        self._preempt_grace_s: float | None = None  # set: the stop is a preemption
        self._done = threading.Event()
        self._outcome: Terminal | None = None
        self._ranks: dict[int, RankStatus] = {}
        self._ranks_lock = threading.Lock()
        self._final_ranks: dict[int, RankState] = {}
        self._thread: threading.Thread | None = None
        self._gang: WorkerGang | None = None
        self._adopt_lock = threading.Lock()
        self.phase = AttemptPhase.IDLE
        self.cfg: AttemptConfig | None = None
        if config is not None:
            self._configure(config)

    def _configure(self, config: AttemptConfig) -> None:
        self._user_code = config.spec.kind is SpecKind.USER_CODE
        storage = config.object_storage
        # With a checkpoint store the marker goes there, once every host uploaded its part.
        self._checkpoints = ReportedCheckpoints(
            root=Path(config.checkpoint_root), world_size=config.world_size,
            attempt=config.attempt, **({"write": _no_marker} if storage else {})
        ) if self._user_code else None
        self._uploads = CheckpointUploads(config, storage) if storage is not None else None
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
                         attempt=cfg.attempt if cfg else 0, phase=self.phase)

    def _enter(self, phase: AttemptPhase) -> None:
        """Moves the attempt's phase forward (never back: a late caller changes nothing)."""
        if PHASE_ORDER.index(phase) > PHASE_ORDER.index(self.phase):
            self.phase = phase

    def ack(self, cursor: int) -> None:
        self.log.ack(cursor)

    def cancel(self, timeout_s: float = 8.0) -> str | None:
        """Stops the workers (gracefully, then by force) and returns the outcome."""
        self._cancel.set()
        self._done.wait(timeout_s)
        return self.outcome()

    def preempt(self, grace_s: float) -> bool:
        """Stops the workers for a higher-priority job, as a cancel does, with `grace_s` for
        them: the built-in loop stops after its next step and saves a checkpoint; a user-code
        rank sees should_stop(), gets SIGTERM, and is killed after `grace_s`. Returns at once
        (the outcome is a Cancelled event; the job's state says it was a preemption)."""
        self._preempt_grace_s = max(0.0, float(grace_s))
        self._cancel.set()
        return True

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
        self.log.emit(gang.stacks(request_id, timeout_s=timeout_s))

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
        self._enter(AttemptPhase.PLACING)
        if not self._seed_checkpoint() or not self._wait_for_placement():
            return
        self._enter(AttemptPhase.STARTING)
        self._gang = gang = WorkerGang(self.config, cancel=self._cancel)
        ranks = gang.create()
        if ranks is None:  # cancelled while creating
            gang.kill()
            self._finish(Cancelled(message="cancelled while starting workers"))
            return
        refused = None if self._user_code else host_local_checkpoints(
            enabled=self.config.spec.checkpoint.enabled,
            shared=self.config.checkpoint_dir is not None
            or self.config.object_storage is not None, root=self.config.checkpoint_root,
            ips={r.rank: r.ip for r in ranks})
        if refused is not None:
            gang.kill()
            self._finish(Failed(reason=Reason.SETUP_ERROR, message=refused, blame=Blame.USER))
            return
        if not self._restore_checkpoint(gang):
            return
        with self._ranks_lock:
            self._ranks = {r.rank: r for r in ranks}
        self.log.emit(WorkersReady(ranks=ranks, master=gang.master))
        gang.launch()
        self._enter(AttemptPhase.RUNNING)
        self._supervise(gang)

    def _restore_checkpoint(self, gang: WorkerGang) -> bool:
        """With a checkpoint store, a restarted attempt's hosts (or a first one started from
        another job's checkpoint) hold the store's newest complete checkpoint before the
        ranks start (runtime/checkpoint_uploads.py); False when that failed (it ended)."""
        cfg = self.config
        storage = cfg.object_storage
        if storage is None or (cfg.attempt == 1 and cfg.spec.checkpoint.resume_from is None):
            return True
        t0 = time.monotonic()
        hosts = gang.host_workers()
        step, error, store_side = restore_checkpoint(
            cfg, storage, hosts, on_wait=lambda text: self._log_line(f"WARNING {text}"))
        if error is not None:
            gang.kill()
            # A store that stayed down is not the job's fault: the attempt is restarted (it
            # counts in max_failures); a host that cannot hold the files is a setup error.
            self._finish(Failed(
                reason=Reason.STORE_UNAVAILABLE if store_side else Reason.SETUP_ERROR,
                blame=Blame.INFRA, message=(
                    f"the checkpoint could not be placed on the job's hosts from "
                    f"{storage.uri}: {error}")))
            return False
        if step is not None:
            self._log_line(f"INFO checkpoint of step {step} downloaded from "
                           f"{storage.step_uri(cfg.job_id, step)} to "
                           f"{len(hosts)} host(s) in "
                           f"{time.monotonic() - t0:.1f} s")
        return True

    def _log_line(self, line: str) -> None:
        self.log.emit(Logs(lines=({"rank": 0, "stream": "log", "time": time.time(),
                                   "line": line},)))

    def _start_uploads(self, saved: list[dict[str, Any]]) -> None:
        if self._uploads is None or self._gang is None:
            return
        hosts = self._gang.host_workers()
        for info in saved:
            self._uploads.start(int(info["step"]), info, hosts)

    def _poll_uploads(self, *, end_within_s: float | None = None) -> None:
        """Checkpoints now complete in the store, reported; with `end_within_s`, the open
        uploads are waited for that long first (the attempt is ending)."""
        if self._uploads is None or self._gang is None:
            return
        cut_off = self._gang.cut_off_hosts
        saved, messages = (self._uploads.poll(cut_off=cut_off) if end_within_s is None else
                           self._uploads.finish(timeout_s=end_within_s, cut_off=cut_off))
        if saved:
            self.log.emit(Checkpoints(saved=tuple(saved)))
        for line in messages:
            self._log_line(line)

    def _seed_checkpoint(self) -> bool:
        """The first attempt of a job that starts from another job's checkpoint copies it in
        (runtime/checkpoint_seed.py; with a checkpoint store, within the store); False when
        that failed (the attempt ended)."""
        if self.config.attempt != 1 or self.config.spec.checkpoint.resume_from is None:
            return True
        if self.config.object_storage is not None:
            return self._seed_in_store(self.config.object_storage)
        try:
            cfg = self.config
            source = cfg.spec.checkpoint.resume_from.job  # type: ignore[union-attr]
            runs = Path(cfg.run_dir).parent
            storage = Path(cfg.checkpoint_dir).parent if cfg.checkpoint_dir else None
            into = checkpoint_place(cfg.job_id, runs_dir=runs, storage=storage)
            # on the checkpoint storage; under its run dir if it ran before there was one
            src = checkpoint_place(source, runs_dir=runs, storage=storage)
            if not (src[0] / src[1]).is_dir():
                src = checkpoint_place(source, runs_dir=runs, storage=None)
            copied = seed_checkpoint(cfg.spec, into=into, source=src)
        except (SeedError, OSError) as exc:
            text = str(exc) if isinstance(exc, SeedError) else (
                f"checkpoint.resume_from: the checkpoint could not be copied: {exc}")
            self._finish(Failed(reason=Reason.SETUP_ERROR, message=text, blame=Blame.USER))
            return False
        if copied:
            resume = self.config.spec.checkpoint.resume_from
            self.log.emit(Logs(lines=({"rank": 0, "stream": "log", "time": time.time(),
                                       "line": f"INFO started from {resume.job}'s checkpoint "
                                       f"of step {resume.step} ({copied} files copied)"},)))
        return True

    def _seed_in_store(self, storage: ObjectStorage) -> bool:
        cfg = self.config
        resume = cfg.spec.checkpoint.resume_from
        assert resume is not None
        try:
            if resume.step in storage.complete_steps(cfg.job_id):
                return True  # copied by an earlier try of this attempt
            copied = storage.copy_step(resume.job, resume.step, cfg.job_id)
        except (StorageError, OSError, ValueError) as exc:
            self._finish(Failed(reason=Reason.SETUP_ERROR, blame=Blame.USER, message=(
                f"checkpoint.resume_from: {exc}; choose a kept one from GET /v1/jobs/"
                f"{resume.job}/checkpoints")))
            return False
        self._log_line(f"INFO started from {resume.job}'s checkpoint of step {resume.step} "
                       f"({copied} files copied in {storage.uri})")
        return True

    def _wait_for_placement(self) -> bool:
        end = wait_for_placement(self.config, cancel=self._cancel, tick_s=_TICK_S)
        if isinstance(end, Placed):
            self.log.emit(end)
            return True
        self._finish(end)
        return False

    def _supervise(self, gang: WorkerGang) -> None:
        first_step = started = False
        grace = _USER_STOP_GRACE_S if self._user_code else _STOP_GRACE_S
        watch = AttemptWatchdog(self.config, emit=self.log.emit)
        while True:
            finished = gang.wait(timeout_s=_TICK_S)
            drained = gang.drain()
            self._forward(drained)
            self._poll_uploads()
            if self._user_code and not started and gang.all_beating():
                started = True
                self.log.emit(ProcessesStarted(pids=gang.pids()))
            if not first_step and gang.last_steps():
                first_step = True
                self.log.emit(FirstStep(step=min(gang.last_steps().values())))
            if self._cancel.is_set():
                self._enter(AttemptPhase.STOPPING)
                preempt = self._preempt_grace_s
                if preempt is None:
                    gang.stop_all(grace_s=grace)
                else:  # the ranks' own grace, and time to report how they ended
                    gang.stop_all(grace_s=preempt + grace, rank_grace_s=preempt)
                self._forward(gang.drain(final=True))
                self._poll_uploads(end_within_s=_END_UPLOADS_S)
                gang.kill()
                self._finish(Cancelled(message="workers stopped on request" if preempt is None
                                       else "workers stopped for preemption"))
                return
            failures = gang.failures()
            if failures:
                self._enter(AttemptPhase.STOPPING)
                # The peers a death takes down end too (their errors name it): until every
                # rank has ended, or none has for 5 s (ranks that keep waiting: an NCCL peer).
                gang.settle(timeout_s=5.0)
                watch.on_failures(gang, gang.failures())  # peers left waiting: diagnose
                gang.stop_all(grace_s=max(grace, 3.0))
                self._forward(gang.drain(final=True))
                failures = gang.failures()  # fallout from other ranks joins the groups
                outcome = failed_outcome(self.config, failures, cause=watch.open_report,
                                         gang=gang)
                if outcome.reason == Reason.PREFLIGHT_FAILED:  # which end of the slow link
                    outcome = locate_slow_end(outcome, gang)
                self._poll_uploads(end_within_s=_END_UPLOADS_S)
                gang.kill()
                self._set_rank_states(rank_end_states(failures, gang.ranks))
                self._finish(replace(outcome, unreachable_nodes=gang.unreachable_nodes()))
                return
            if finished and gang.all_done():
                self._forward(gang.drain(final=True))
                self._poll_uploads(end_within_s=_FINAL_UPLOADS_S)
                gang.kill(succeeded=True)
                self._finish(Succeeded())
                return
            act = watch.tick(gang, drained)
            if act is not None:  # watchdog.action restart | fail: the hung workers are killed
                self._poll_uploads(end_within_s=_END_UPLOADS_S)
                gang.kill()
                self._finish(replace(act, unreachable_nodes=gang.unreachable_nodes()))
                return

    def _forward(self, drained: Drained) -> None:
        if drained.metrics:
            completed = self._checkpoints.observe(drained.metrics) \
                if self._checkpoints is not None else []
            self.log.emit(Metrics(rows=drained.metrics))
            if completed and self._checkpoints is not None:
                saved = [self._checkpoints.saved_info(step) for step in completed]
                if self._uploads is not None:
                    self._start_uploads(saved)
                else:
                    self.log.emit(Checkpoints(saved=tuple(saved)))
        if drained.logs:
            self.log.emit(Logs(lines=drained.logs))
        if drained.usage:
            self.log.emit(Usage(rows=drained.usage))
        if drained.checkpoints and self._uploads is not None:
            self._start_uploads(list(drained.checkpoints))
        elif drained.checkpoints:
            self.log.emit(Checkpoints(saved=drained.checkpoints))
        for gap in drained.gaps:
            self.log.emit(LinkGap(**gap))
        if drained.ranks:
            with self._ranks_lock:
                for rank, upd in drained.ranks.items():
                    self._ranks[rank] = self._ranks.get(rank, RankStatus(rank=rank)).observed(
                        **upd)

    def _set_rank_states(self, states: dict[int, RankState]) -> None:
        """The ranks' final states, kept by _finish (a failed attempt's culprits, lost peers
        and stopped bystanders)."""
        with self._ranks_lock:
            for r, state in states.items():
                self._ranks[r] = replace(self._ranks.get(r, RankStatus(rank=r)), state=state)
            self._final_ranks.update(states)

    def _finish(self, outcome: Terminal) -> None:
        final = _FINAL_STATE.get(type(outcome))
        with self._ranks_lock:
            if final is not None:
                for r, status in self._ranks.items():
                    if status.state != RankState.FAILED and r not in self._final_ranks:
                        self._ranks[r] = replace(status, state=final)
        self.log.emit(outcome)
        self._outcome = outcome
        self._enter(AttemptPhase.ENDED)
        self._done.set()


def wait_for_placement(cfg: AttemptConfig, *, cancel: Any, tick_s: float
                       ) -> Placed | Cancelled | PlacementTimeout:
    """Waits for the attempt's placement group: Placed, or how the wait ended."""
    ready = ray.util.get_placement_group(cfg.pg_name).ready()
    deadline = time.monotonic() + cfg.placement_timeout_s
    t0 = time.monotonic()
    while True:
        done, _ = ray.wait([ready], timeout=tick_s)
        if done:
            return Placed(waited_s=round(time.monotonic() - t0, 3))
        if cancel.is_set():
            return Cancelled(message="cancelled while waiting for placement")
        if time.monotonic() > deadline:
            return PlacementTimeout(
                waited_s=cfg.placement_timeout_s,
                message=f"gang reservation of {cfg.world_size} bundles not ready after "
                f"{cfg.placement_timeout_s:g} s")


RemoteController: Any = ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_concurrency=16, max_restarts=0)(AttemptController)


def controller_options(name: str, near_node_id: str | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "lifetime": "detached"}
    if near_node_id:
        # On the control plane's own node: losing a worker host must not take the controller
        # (and with it the attempt's diagnosis) along. The affinity is hard: a soft one lets
        # Ray put this 0-CPU actor on any node when the control plane's node declares no CPUs,
        # as a deployment's control plane node does.
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(near_node_id, soft=False)
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
