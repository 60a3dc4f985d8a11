"""The control plane's side of every controller: poll with a cursor, write, acknowledge.

The poller is the only writer of what the controllers report. Per active job, each pass:
  find the attempt's controller by name (reattach after a restart) -> poll(after=cursor) ->
  write the events in order (state transitions, ranks, metrics, logs) -> store the cursor ->
  ack. A crash between writing and storing the cursor replays at most one batch.

It applies decisions, it does not make them: after a failed attempt `policy.restart_decision`
says restart, fail or finish a cancel. Besides that:
  * CANCELLING -> controller.cancel(); CANCELLED once it reports (or forcibly after 8 s);
  * PREEMPTED -> controller.preempt(grace_s): the same stop with the job's grace period;
    QUEUED once it reports (or forcibly after grace_s + 8 s), to resume from its checkpoint;
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
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from orchestrator.lifecycle import ACTIVE_STATES, AttemptState, JobState, Reason
from orchestrator.nodes.health_policy import HealthPolicy
from orchestrator.runtime.attempt_events import AttemptEvents, ts
from orchestrator.runtime.controller import find_controller, recorded_controller_name
from orchestrator.runtime.events import (
    NAMESPACE,
    PollReply,
    RankStatus,
    is_spare_controller_name,
    parse_controller_name,
    parse_pg_name,
    pg_name,
)
from orchestrator.runtime.stack_requests import serve_stack_requests
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.watchdog.condition import JobCondition

log = logging.getLogger("meshyard.poller")
_POLL_TIMEOUT_S = 10.0
_CANCEL_DEADLINE_S = 8.0
_LOST_AFTER_S = 3.0


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
        row["last_heartbeat"] = ts(r.last_heartbeat)
    if r.collectives is not None:
        row["collectives"] = r.collectives
    for key in ("progress_first_at", "progress_at"):
        if getattr(r, key):
            row[key] = ts(getattr(r, key))
    return row


class Poller:
    def __init__(self, store: Store, *, launching: set[str] | None = None,
                 health_policy: HealthPolicy | None = None,
                 runs_dir: Path | None = None) -> None:
        self.store = store
        self.runs_dir = runs_dir  # where the attempts' metrics files are (metrics_files.py)
        self.health_policy = health_policy or HealthPolicy()
        self.events = AttemptEvents(store, health_policy=self.health_policy, runs_dir=runs_dir,
                                    write_ranks=self._write_ranks)
        # Jobs the scheduler is placing right now (PLACING written, controller not yet
        # created): not "lost". Shared with the scheduler; set operations are atomic.
        self.launching = launching if launching is not None else set()
        self._cancel_sent: dict[tuple[str, int], float] = {}
        self._ranks_seen: dict[tuple[str, int], dict[int, tuple[Any, ...]]] = {}
        self._missing: dict[tuple[str, int], float] = {}
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
        elif job.state == JobState.PREEMPTED:
            self._request_preempt(job, handle)
        try:
            self._drain(job, handle)
        except (RayActorError, GetTimeoutError) as exc:
            log.warning("controller of %s attempt %d unreachable: %s", job.id, n, exc)
            if job.state == JobState.CANCELLING:
                self._force_cancel(job)

    # -- polling --------------------------------------------------------------------------
    def _drain(self, job: JobRecord, handle: Any) -> None:
        n = job.current_attempt
        self.events.conditions[job.id] = JobCondition.from_dict(job.condition) \
            if job.condition else None
        cursor = self.store.get_cursor(job.id, n)
        while True:
            reply: PollReply = ray.get(handle.poll.remote(cursor), timeout=_POLL_TIMEOUT_S)
            self._write_ranks(job.id, n, reply.ranks)
            if not reply.events:
                return
            terminal = False
            for ev in reply.events:
                self.events.apply(job.id, n, ev)
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

    def _request_cancel(self, job: JobRecord, handle: Any) -> None:
        key = (job.id, job.current_attempt)
        sent = self._cancel_sent.get(key)
        if sent is None:
            self._cancel_sent[key] = time.monotonic()
            handle.cancel.remote()
        elif time.monotonic() - sent > _CANCEL_DEADLINE_S:
            self._force_cancel(job)

    def _request_preempt(self, job: JobRecord, handle: Any) -> None:
        """Asks the controller to stop the workers for preemption (once); a controller that
        has not reported them stopped after their grace period and the cancel deadline is
        killed, and the job requeued (it resumes from its last complete checkpoint)."""
        key = (job.id, job.current_attempt)
        grace = job.spec.preemption.grace_s
        sent = self._cancel_sent.get(key)
        if sent is None:
            self._cancel_sent[key] = time.monotonic()
            handle.preempt.remote(grace)
        elif time.monotonic() - sent > grace + _CANCEL_DEADLINE_S:
            n = job.current_attempt
            self._cleanup(job.id, n)
            self.store.end_attempt(job.id, n, state=AttemptState.PREEMPTED,
                                   message="stopped by force")
            self.events.requeue_preempted(job.id, "workers stopped by force after the grace "
                                          "period")

    def _force_cancel(self, job: JobRecord) -> None:
        """The controller did not confirm in time: kill it (its workers die with it)."""
        n = job.current_attempt
        self._cleanup(job.id, n)
        self.store.end_attempt(job.id, n, state=AttemptState.CANCELLED, message="stopped by force")
        self.events.finish_cancel(job.id)

    def _controller_lost(self, job: JobRecord) -> None:
        n = job.current_attempt
        log.warning("controller of %s attempt %d lost (job %s)", job.id, n, job.state)
        self._kill_controller(job.id, n)
        remove_pg(job.id, n)
        if job.state == JobState.CANCELLING:
            if n:
                self.store.end_attempt(job.id, n, state=AttemptState.CANCELLED,
                                       message="no controller")
            self.events.finish_cancel(job.id)
        elif job.state == JobState.PREEMPTED:
            if n:
                self.store.end_attempt(job.id, n, state=AttemptState.PREEMPTED,
                                       message="no controller")
            self.events.requeue_preempted(job.id, "the controller was gone")
        elif job.state in (JobState.PLACING, JobState.RESTARTING):
            if n:
                self.store.end_attempt(job.id, n, state=AttemptState.LOST,
                                       message="controller lost")
            self.events.move(job.id, JobState.QUEUED, Reason.CONTROLLER_LOST,
                       "the controller was lost before training started; placing again")
        elif job.state in ACTIVE_STATES:
            self.events.recover_metrics(job.id, n)
            self.events.attempt_failed(job.id, n, reason=Reason.CONTROLLER_LOST,
                                 message="the attempt's controller is gone (its node or the "
                                 "control plane died while it ran)",
                                 data={"failed_nodes": [], "attempt": n})

    def _cleanup(self, job_id: str, n: int) -> None:
        self._kill_controller(job_id, n)
        remove_pg(job_id, n)
        self._cancel_sent.pop((job_id, n), None)
        self._ranks_seen.pop((job_id, n), None)
        self.events.conditions.pop(job_id, None)


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
