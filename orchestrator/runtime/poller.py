"""The control plane's side of every controller: poll with a cursor, write, acknowledge.

The poller is the only writer of what the controllers report. Per active job, each pass:
  find the attempt's controller by name (reattach after a restart) -> poll(after=cursor) ->
  write the events in order (state transitions, ranks, metrics, logs) -> store the cursor ->
  ack. A crash between writing and storing the cursor replays at most one batch.

It applies decisions, it does not make them: after a failed attempt `policy.restart_decision`
says restart, fail or finish a cancel. Besides that:
  * CANCELLING -> controller.cancel(); CANCELLED once it reports (or forcibly after 8 s);
  * evidence about nodes (a diagnosis, a failed attempt's errors) goes to the node health
    ledger (runtime/health.py), which may cordon a node before the restart is placed;
  * controller gone (control plane was down, node lost): PLACING -> requeue; STARTING /
    RUNNING -> a failed attempt (CONTROLLER_LOST) under the same restart policy, after the
    metrics its workers reported after the last poll are read from their files
    (runtime/metrics_files.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from orchestrator.health import HealthPolicy
from orchestrator.lifecycle import ACTIVE_STATES, AttemptState, IllegalTransition, JobState, Reason
from orchestrator.placement.gang_plan import Pending, PendingKind
from orchestrator.runtime.controller import find_controller, recorded_controller_name
from orchestrator.runtime.events import (
    NAMESPACE,
    Cancelled,
    Checkpoints,
    ControllerEvent,
    Diagnosis,
    Failed,
    FirstStep,
    Logs,
    Metrics,
    Placed,
    PlacementTimeout,
    PollReply,
    ProcessesStarted,
    RankStatus,
    Stacks,
    Succeeded,
    Usage,
    WatchdogError,
    WorkersReady,
    is_spare_controller_name,
    parse_controller_name,
    parse_pg_name,
    pg_name,
)
from orchestrator.runtime.health import record_diagnosis, record_failure, record_preflight
from orchestrator.runtime.metrics_files import ingest_attempt_files
from orchestrator.runtime.policy import AttemptFailure, Outcome, restart_decision
from orchestrator.runtime.stack_requests import record_stacks, serve_stack_requests
from orchestrator.spec import WatchdogAction, parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.watchdog.condition import JobCondition
from orchestrator.watchdog.report import Verdict

log = logging.getLogger("meshyard.poller")
_POLL_TIMEOUT_S = 10.0
_CANCEL_DEADLINE_S = 8.0
_LOST_AFTER_S = 3.0


def _ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value else None


def remove_pg(job_id: str, attempt: int) -> None:
    try:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(ray.util.get_placement_group(pg_name(job_id, attempt)))
    except (ValueError, RayError):
        pass  # never created or already removed


def kill_controller(job_id: str, attempt: int, name: str | None = None) -> None:
    """Kills the attempt's controller (`name`: the one its placement records)."""
    handle = find_controller(job_id, attempt, name)
    if handle is not None:
        with contextlib.suppress(ValueError, RayError):
            ray.kill(handle, no_restart=True)


def _rank_row(r: RankStatus) -> dict[str, Any]:
    row: dict[str, Any] = {"rank": r.rank, "node": r.node, "node_id": r.node_id, "gpu": r.gpu,
                           "coords": dict(r.coords), "state": r.state.value, "step": r.step,
                           "phase": r.phase, "pid": r.pid}
    if r.last_heartbeat:
        row["last_heartbeat"] = _ts(r.last_heartbeat)
    return row


class Poller:
    def __init__(self, store: Store, *, launching: set[str] | None = None,
                 health_policy: HealthPolicy | None = None,
                 runs_dir: Path | None = None) -> None:
        self.store = store
        self.runs_dir = runs_dir  # where the attempts' metrics files are (metrics_files.py)
        self.health_policy = health_policy or HealthPolicy()
        # Jobs the scheduler is placing right now (PLACING written, controller not yet
        # created): not "lost". Shared with the scheduler; set operations are atomic.
        self.launching = launching if launching is not None else set()
        self._cancel_sent: dict[tuple[str, int], float] = {}
        self._ranks_seen: dict[tuple[str, int], dict[int, tuple[Any, ...]]] = {}
        self._missing: dict[tuple[str, int], float] = {}
        self._conditions: dict[str, JobCondition | None] = {}  # job id -> open condition
        self._names: dict[tuple[str, int], str] = {}  # attempt -> its controller's name

    def _controller_name(self, job_id: str, n: int) -> str:
        key = (job_id, n)
        if key not in self._names:
            self._names[key] = recorded_controller_name(self.store, job_id, n)
        return self._names[key]

    def _kill_controller(self, job_id: str, n: int) -> None:
        """Kills the attempt's controller by the name its placement records, and forgets it."""
        kill_controller(job_id, n, self._controller_name(job_id, n) if n else None)
        self._names.pop((job_id, n), None)

    def tick(self) -> None:
        for job in self.store.active_jobs():
            try:
                self._job(job)
            except Exception:  # noqa: BLE001 - one bad job must not stop the others
                log.exception("polling %s failed", job.id)
        try:
            serve_stack_requests(self.store)
        except Exception:  # noqa: BLE001
            log.exception("serving stacks requests failed")

    def _job(self, job: JobRecord) -> None:
        if job.id in self.launching:
            return
        n = job.current_attempt
        handle = find_controller(job.id, n, self._controller_name(job.id, n)) if n else None
        if handle is None:
            # A name lookup can miss under load; only a miss that lasts is a lost controller.
            first = self._missing.setdefault((job.id, n), time.monotonic())
            if time.monotonic() - first >= _LOST_AFTER_S:
                self._missing.pop((job.id, n), None)
                self._controller_lost(job)
            return
        self._missing.pop((job.id, n), None)
        if job.state == JobState.CANCELLING:
            self._request_cancel(job, handle)
        try:
            self._drain(job, handle)
        except (RayActorError, GetTimeoutError) as exc:
            log.warning("controller of %s attempt %d unreachable: %s", job.id, n, exc)
            if job.state == JobState.CANCELLING:
                self._force_cancel(job)

    # -- polling --------------------------------------------------------------------------
    def _drain(self, job: JobRecord, handle: Any) -> None:
        n = job.current_attempt
        self._conditions[job.id] = JobCondition.from_dict(job.condition) \
            if job.condition else None
        cursor = self.store.get_cursor(job.id, n)
        while True:
            reply: PollReply = ray.get(handle.poll.remote(cursor), timeout=_POLL_TIMEOUT_S)
            self._write_ranks(job.id, n, reply.ranks)
            if not reply.events:
                return
            terminal = False
            for ev in reply.events:
                self._apply(job.id, n, ev)
                terminal = terminal or ev.terminal
            cursor = reply.events[-1].seq
            self.store.set_cursor(job.id, n, cursor)
            handle.ack.remote(cursor)
            if terminal:
                self._cleanup(job.id, n)
                return

    def _write_ranks(self, job_id: str, n: int, ranks: tuple[RankStatus, ...]) -> None:
        seen = self._ranks_seen.setdefault((job_id, n), {})
        changed = []
        for r in ranks:
            key = r.stored()
            if seen.get(r.rank) != key:
                seen[r.rank] = key
                changed.append(_rank_row(r))
        if changed:
            self.store.upsert_ranks(job_id, n, changed)

    def _apply(self, job_id: str, n: int, ev: ControllerEvent) -> None:
        """Writes one controller event."""
        match ev.payload:
            case Metrics(rows=rows):
                self.store.add_metrics(job_id, n, list(rows), cursor=ev.seq)
                self._maybe_clear_condition(job_id, n, rows)
            case Logs(lines=lines):
                self.store.add_logs(job_id, n, [dict(x, at=_ts(x.get("time"))) for x in lines],
                                    cursor=ev.seq)
            case Stacks():
                record_stacks(self.store, ev.payload)
            case Usage(rows=rows):
                self.store.add_rank_usage(job_id, n, rows, cursor=ev.seq)
            case Checkpoints(saved=saved):
                for info in saved:
                    self.store.add_checkpoint(job_id, n, info, cursor=ev.seq)
            case Placed(waited_s=waited):
                self._move(job_id, JobState.STARTING, Reason.PLACEMENT_FOUND,
                           f"gang reservation ready after {waited:g} s")
            case WorkersReady(ranks=ranks, master=m):
                self._write_ranks(job_id, n, ranks)
                self.store.add_event(job_id, kind="info", reason=Reason.WORKERS_READY.value,
                                     message=f"{len(ranks)} workers up; rank 0 at "
                                     f"{m.addr}:{m.port}",
                                     data={"master": {"addr": m.addr, "port": m.port}})
            case FirstStep(step=step):
                self._move(job_id, JobState.RUNNING, Reason.FIRST_STEP, f"step {step} done")
            case ProcessesStarted(pids=pids):
                self._move(job_id, JobState.RUNNING, Reason.PROCESSES_STARTED,
                           f"{len(pids)} rank processes running")
            case Diagnosis():
                self._record_diagnosis(job_id, n, ev.payload)
            case WatchdogError(message=message):
                log.warning("%s: hang watchdog error: %s", job_id, message)
            case Succeeded():
                self.store.end_attempt(job_id, n, state=AttemptState.SUCCEEDED)
                self._move(job_id, JobState.SUCCEEDED, Reason.COMPLETED, "training finished")
            case Cancelled(message=message):
                self.store.end_attempt(job_id, n, state=AttemptState.CANCELLED, message=message)
                self._finish_cancel(job_id)
            case PlacementTimeout(message=message, waited_s=waited):
                self.store.end_attempt(job_id, n, state=AttemptState.PLACEMENT_TIMEOUT,
                                       message=message)
                self._move(job_id, JobState.QUEUED, Reason.PLACEMENT_TIMEOUT, message)
                pending = Pending(PendingKind.PLACEMENT_TIMEOUT, message, waited_s=waited)
                self.store.set_pending_reason(job_id, pending.to_dict())
            case Failed() as f:
                self._recover_metrics(job_id, n)
                groups = [g.to_dict() for g in f.groups]
                if f.reason == Reason.PREFLIGHT_FAILED:
                    record_preflight(self.store, f.avoid_nodes, message=f.message,
                                     job_id=job_id, policy=self.health_policy)
                else:
                    record_failure(self.store, groups, job_id=job_id,
                                   policy=self.health_policy)
                failure = AttemptFailure(attempt=n, failed_nodes=f.failed_nodes,
                                         avoid_nodes=f.avoid_nodes)
                self._attempt_failed(job_id, n, reason=f.reason, message=f.message,
                                     data=failure.event_data(groups=groups),
                                     final=f.hang_action == WatchdogAction.FAIL)

    def _record_diagnosis(self, job_id: str, n: int, d: Diagnosis) -> None:
        """Stores a hang watchdog report with its attempt, a job event pointing at it
        (GET /v1/jobs/{id}/diagnoses and the dashboard show it), and opens the job's
        condition ("hung since ...") until progress resumes."""
        report = d.report.to_dict()
        report["details"] = {**report.get("details", {}), "trigger": d.trigger,
                             "detected_at": d.detected_at}
        verdict, culprits = d.report.verdict.value, list(d.report.culprit_ranks)
        stored = self.store.add_diagnosis(job_id, n, verdict=verdict, culprit_ranks=culprits,
                                          summary=d.report.summary, report=report)
        job = self.store.get_job(job_id)
        if job is not None and job.current_attempt == n and not job.state.terminal:
            condition = JobCondition.from_report(d.report, diagnosis_id=stored.id, attempt=n,
                                                 since=d.detected_at, step=job.last_step)
            self.store.set_condition(job_id, condition.to_dict())
            self._conditions[job_id] = condition
        kind = "info" if d.report.verdict is Verdict.STRAGGLER else "warning"
        self.store.add_event(job_id, kind=kind, reason=verdict,
                             message=f"diagnosis (attempt {n}): {d.report.summary}",
                             data={"verdict": verdict, "culprit_ranks": culprits,
                                   "attempt": n, "diagnosis_id": stored.id})
        record_diagnosis(self.store, d.report, job_id=job_id, diagnosis_id=stored.id,
                         policy=self.health_policy)

    def _maybe_clear_condition(self, job_id: str, n: int, rows: Any) -> None:
        condition = self._conditions.get(job_id)
        steps = [int(x["step"]) for x in rows if x.get("step") is not None]
        if condition is None or condition.attempt != n or not steps \
                or not condition.cleared_by(max(steps)):
            return
        self.store.set_condition(job_id, None)
        self._conditions[job_id] = None
        self.store.add_event(job_id, kind="info", reason=Reason.PROGRESS_RESUMED.value,
                             message=f"progress resumed at step {max(steps)}; no longer "
                             f"{condition.kind} ({condition.headline})",
                             data={"diagnosis_id": condition.diagnosis_id})

    # -- applying the restart policy --------------------------------------------------------
    def _attempt_failed(self, job_id: str, n: int, *, reason: Reason, message: str,
                        data: dict[str, Any], final: bool = False) -> None:
        """Records attempt `n`'s failure (`data`: its AttemptFailure.event_data) and applies
        the restart policy's decision. `final`: the hang watchdog's action is fail."""
        self.store.end_attempt(job_id, n, state=AttemptState.FAILED,
                               failure_reason=reason.value, message=message)
        self.store.add_event(job_id, kind="error", reason=reason.value,
                             message=f"attempt {n} failed: {message}", data=data)
        job = self.store.get_job(job_id)
        assert job is not None
        ended = [a for a in self.store.list_attempts(job_id) if a.state == AttemptState.FAILED]
        checks = sum(1 for a in ended if a.failure_reason == Reason.PREFLIGHT_FAILED.value)
        decision = restart_decision(
            attempt=n, failed=len(ended) - checks, preflight_failed=checks, reason=reason,
            message=message,
            max_failures=parse_spec(job.spec).fault_tolerance.max_failures,
            hang_action=WatchdogAction.FAIL if final else None,
            cancelling=job.state == JobState.CANCELLING)
        if decision.outcome == Outcome.FINISH_CANCEL:
            self._finish_cancel(job_id)
        elif decision.outcome == Outcome.RESTART:
            self._move(job_id, JobState.RESTARTING, decision.reason, decision.message, data)
            self._move(job_id, JobState.QUEUED, Reason.RESTART_SCHEDULED,
                       decision.requeue_message)
        else:
            self._move(job_id, JobState.FAILED, decision.reason, decision.message, data)

    def _move(self, job_id: str, dst: JobState, reason: Reason, message: str,
              data: dict[str, Any] | None = None) -> None:
        job = self.store.get_job(job_id)
        if job is None or job.state == dst:
            return  # replayed batch after a restart: already applied
        if job.state == JobState.CANCELLING and dst not in (JobState.CANCELLED, JobState.FAILED):
            return  # cancel wins over progress reported after it was requested
        try:
            self.store.transition(job_id, dst, reason=reason, message=message, data=data)
        except IllegalTransition as exc:
            log.warning("%s: %s", job_id, exc)

    def _request_cancel(self, job: JobRecord, handle: Any) -> None:
        key = (job.id, job.current_attempt)
        sent = self._cancel_sent.get(key)
        if sent is None:
            self._cancel_sent[key] = time.monotonic()
            handle.cancel.remote()
        elif time.monotonic() - sent > _CANCEL_DEADLINE_S:
            self._force_cancel(job)

    def _force_cancel(self, job: JobRecord) -> None:
        """The controller did not confirm in time: kill it (its workers die with it)."""
        n = job.current_attempt
        self._cleanup(job.id, n)
        self.store.end_attempt(job.id, n, state=AttemptState.CANCELLED, message="stopped by force")
        self._finish_cancel(job.id)

    def _finish_cancel(self, job_id: str) -> None:
        self._move(job_id, JobState.CANCELLED, Reason.WORKERS_STOPPED,
                   "workers stopped, placement group removed")

    def _controller_lost(self, job: JobRecord) -> None:
        n = job.current_attempt
        log.warning("controller of %s attempt %d lost (job %s)", job.id, n, job.state)
        self._kill_controller(job.id, n)
        remove_pg(job.id, n)
        if job.state == JobState.CANCELLING:
            if n:
                self.store.end_attempt(job.id, n, state=AttemptState.CANCELLED,
                                       message="no controller")
            self._finish_cancel(job.id)
        elif job.state in (JobState.PLACING, JobState.RESTARTING):
            if n:
                self.store.end_attempt(job.id, n, state=AttemptState.LOST,
                                       message="controller lost")
            self._move(job.id, JobState.QUEUED, Reason.CONTROLLER_LOST,
                       "the controller was lost before training started; placing again")
        elif job.state in ACTIVE_STATES:
            self._recover_metrics(job.id, n)
            self._attempt_failed(job.id, n, reason=Reason.CONTROLLER_LOST,
                                 message="the attempt's controller is gone (its node or the "
                                 "control plane died while it ran)",
                                 data={"failed_nodes": [], "attempt": n})

    def _recover_metrics(self, job_id: str, attempt: int) -> None:
        """The rows a failed or lost attempt's workers kept in their files and no poll
        fetched: reported after the last poll, or done since the last sync step."""
        job = self.store.get_job(job_id)
        if self.runs_dir is None or not attempt or job is None:
            return
        try:
            ingest_attempt_files(self.store, job_id=job_id, attempt=attempt,
                                 run_dir=self.runs_dir / job_id, world_size=job.world_size)
        except Exception:  # noqa: BLE001 - recovering metrics must not block the restart
            log.exception("recovering the metrics of %s attempt %d failed", job_id, attempt)

    def _cleanup(self, job_id: str, n: int) -> None:
        self._kill_controller(job_id, n)
        remove_pg(job_id, n)
        self._cancel_sent.pop((job_id, n), None)
        self._ranks_seen.pop((job_id, n), None)
        self._conditions.pop(job_id, None)


def sweep_orphans(store: Store, *, launching: set[str] | frozenset[str] = frozenset(),
                  spares: set[str] | frozenset[str] = frozenset()) -> int:
    """Removes controllers and placement groups of attempts that are no longer current and
    active (left behind by a control plane that died between writing and cleaning up), and
    spare controllers (runtime/spares.py) that no live attempt records and that are not
    among `spares` (the ones this control plane holds).

    Ray is listed before the database is read: an attempt is in the database before its
    group and controller exist (and records a spare's name before the spare adopts it), so
    anything listed and not live in the newer read is stale.
    """
    from ray.util import placement_group_table

    actors = [(a["name"], a.get("namespace")) if isinstance(a, dict) else (a, NAMESPACE)
              for a in ray.util.list_named_actors(all_namespaces=True)]
    groups = [(p.get("name", ""), p.get("state")) for p in placement_group_table().values()]
    active = store.active_jobs()
    live = {(j.id, j.current_attempt) for j in active}
    recorded = {recorded_controller_name(store, j.id, j.current_attempt) for j in active}
    removed = 0
    for name, ns in actors:
        if ns != NAMESPACE:
            continue
        key = parse_controller_name(name)
        if key and key not in live and key[0] not in launching:
            log.warning("killing orphaned controller %s", name)
            kill_controller(*key)
            removed += 1
        elif is_spare_controller_name(name) and name not in recorded and name not in spares:
            log.warning("killing orphaned spare controller %s", name)
            kill_controller("", 0, name)
            removed += 1
    for name, state in groups:
        key = parse_pg_name(name)
        if key and key not in live and key[0] not in launching and state != "REMOVED":
            log.warning("removing orphaned placement group %s", name)
            remove_pg(*key)
            removed += 1
    return removed
