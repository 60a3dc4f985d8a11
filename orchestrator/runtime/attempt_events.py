"""Writing what a controller reported, event by event: metrics, logs, usage, checkpoints and
stacks into the store; state moves (a replayed move is skipped, a cancel wins over progress
reported after it); a diagnosis with its open condition and its node-health evidence; a
failed attempt with the restart policy's decision (`policy.restart_decision`), in one
transaction. The poller (orchestrator/runtime/poller.py) finds the controllers and feeds this.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.lifecycle import AttemptState, IllegalTransition, JobEventKind, JobState, Reason
from orchestrator.nodes.health_policy import HealthPolicy
from orchestrator.placement.gang_plan import Pending, PendingKind
from orchestrator.runtime.events import (
    Cancelled,
    Checkpoints,
    ControllerEvent,
    Diagnosis,
    Failed,
    FirstStep,
    LinkGap,
    Logs,
    Metrics,
    Placed,
    PlacementTimeout,
    ProcessesStarted,
    SlowLink,
    Stacks,
    Succeeded,
    Usage,
    WatchdogError,
    WorkersReady,
)
from orchestrator.runtime.failures import Blame
from orchestrator.runtime.metrics_files import ingest_attempt_files
from orchestrator.runtime.node_health import (
    record_diagnosis,
    record_failure,
    record_preflight,
    record_slow_link,
)
from orchestrator.runtime.policy import AttemptFailure, Outcome, restart_decision
from orchestrator.runtime.stack_requests import record_stacks
from orchestrator.spec import WatchdogAction
from orchestrator.store.jobs import Move
from orchestrator.store.records import AttemptRecord, JobRecord
from orchestrator.store.repo import Store
from orchestrator.watchdog.condition import JobCondition
from orchestrator.watchdog.report import Verdict

log = logging.getLogger("meshyard.poller")


def ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value else None


class AttemptEvents:
    def __init__(self, store: Store, *, health_policy: HealthPolicy,
                 runs_dir: Path | None, write_ranks: Any) -> None:
        self.store = store
        self.health_policy = health_policy
        self.runs_dir = runs_dir  # where the attempts' metrics files are (metrics_files.py)
        self.write_ranks = write_ranks  # (job id, attempt, ranks) -> None
        self.conditions: dict[str, JobCondition | None] = {}  # job id -> open condition

    def apply(self, job_id: str, n: int, ev: ControllerEvent) -> None:
        """Writes one controller event."""
        match ev.payload:
            case Metrics(rows=rows):
                self.store.add_metrics(job_id, n, list(rows), cursor=ev.seq)
                self.maybe_clear_condition(job_id, n, rows)
            case Logs(lines=lines):
                self.store.add_logs(job_id, n, [dict(x, at=ts(x.get("time"))) for x in lines],
                                    cursor=ev.seq)
            case Stacks():
                record_stacks(self.store, ev.payload)
            case Usage(rows=rows):
                self.store.add_rank_usage(job_id, n, rows, cursor=ev.seq)
            case Checkpoints(saved=saved):
                for info in saved:
                    self.store.add_checkpoint(job_id, n, info, cursor=ev.seq)
            case Placed(waited_s=waited):
                self.move(job_id, JobState.STARTING, Reason.PLACEMENT_FOUND,
                           f"gang reservation ready after {waited:g} s")
            case WorkersReady(ranks=ranks, master=m):
                self.write_ranks(job_id, n, ranks)
                self.store.add_event(job_id, kind=JobEventKind.INFO,
                                     reason=Reason.WORKERS_READY.value,
                                     message=f"{len(ranks)} workers up; rank 0 at "
                                     f"{m.addr}:{m.port}",
                                     data={"master": {"addr": m.addr, "port": m.port}})
            case FirstStep(step=step):
                self.move(job_id, JobState.RUNNING, Reason.FIRST_STEP, f"step {step} done")
            case ProcessesStarted(pids=pids):
                self.move(job_id, JobState.RUNNING, Reason.PROCESSES_STARTED,
                           f"{len(pids)} rank processes running")
            case Diagnosis():
                self.record_diagnosis_report(job_id, n, ev.payload)
            case LinkGap(rank=rank, node=node, host=host, silent_s=silent):
                self.store.add_event(
                    job_id, kind=JobEventKind.WARNING, reason=Reason.LINK_GAP.value,
                    message=f"rank {rank} on {node} ({host}) answered no poll for {silent:g} s "
                    "while the other ranks did, then answered again: its link dropped and came "
                    "back, or its host was too busy to answer; training went on",
                    data={"attempt": n, "rank": rank, "node": node, "host": host,
                          "silent_s": silent})
            case SlowLink(node=node, host=host, gbps=gbps, others_gbps=others, slower=slower,
                          link=link):
                message = (f"steps take {slower:g}x as long as this attempt's first ones and "
                           f"no rank straggles: the link of {node} ({host}) is the slow end, "
                           f"{gbps:.3g} GB/s measured from the control plane's node where the "
                           f"gang's other hosts gave {others:.3g} GB/s ({link}); {node} is "
                           "suspect, and the next placement's pre-flight check refuses it "
                           "while it is slow")
                self.store.add_event(
                    job_id, kind=JobEventKind.WARNING, reason=Reason.SLOW_LINK.value,
                    message=message, data={"attempt": n, "node": node, "host": host,
                                           "gbps": gbps, "others_gbps": others,
                                           "slower": slower, "link": link})
                record_slow_link(self.store, node, message=message, job_id=job_id,
                                 policy=self.health_policy)
            case WatchdogError(message=message):
                log.warning("%s: hang watchdog error: %s", job_id, message)
            case Succeeded():
                self.store.end_attempt(job_id, n, state=AttemptState.SUCCEEDED)
                self.move(job_id, JobState.SUCCEEDED, Reason.COMPLETED, "training finished")
            case Cancelled(message=message):
                job = self.store.get_job(job_id)
                if job is not None and job.state == JobState.PREEMPTED:
                    self.store.end_attempt(job_id, n, state=AttemptState.PREEMPTED,
                                           message=message)
                    self.requeue_preempted(job_id, message)
                    return
                self.store.end_attempt(job_id, n, state=AttemptState.CANCELLED, message=message)
                self.finish_cancel(job_id)
            case PlacementTimeout(message=message, waited_s=waited):
                self.store.end_attempt(job_id, n, state=AttemptState.PLACEMENT_TIMEOUT,
                                       message=message)
                self.move(job_id, JobState.QUEUED, Reason.PLACEMENT_TIMEOUT, message)
                pending = Pending(PendingKind.PLACEMENT_TIMEOUT, message, waited_s=waited)
                self.store.set_pending_reason(job_id, pending.to_dict())
            case Failed() as f:
                self.recover_metrics(job_id, n, unreachable=f.unreachable_nodes)
                groups = [g.to_dict() for g in f.groups]
                if f.reason == Reason.PREFLIGHT_FAILED:
                    record_preflight(self.store, f.avoid_nodes, message=f.message,
                                     job_id=job_id, policy=self.health_policy)
                else:
                    record_failure(self.store, groups, job_id=job_id,
                                   policy=self.health_policy)
                failure = AttemptFailure(attempt=n, failed_nodes=f.failed_nodes,
                                         avoid_nodes=f.avoid_nodes, blame=f.blame.value)
                self.attempt_failed(job_id, n, reason=f.reason, message=f.message,
                                     data=failure.event_data(groups=groups),
                                     final=f.hang_action == WatchdogAction.FAIL,
                                     user_error=f.blame is Blame.USER and not f.retry_matched)

    def record_diagnosis_report(self, job_id: str, n: int, d: Diagnosis) -> None:
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
            self.conditions[job_id] = condition
        kind = JobEventKind.INFO if d.report.verdict is Verdict.STRAGGLER else JobEventKind.WARNING
        self.store.add_event(job_id, kind=kind, reason=verdict,
                             message=f"diagnosis (attempt {n}): {d.report.summary}",
                             data={"verdict": verdict, "culprit_ranks": culprits,
                                   "attempt": n, "diagnosis_id": stored.id})
        record_diagnosis(self.store, d.report, job_id=job_id, diagnosis_id=stored.id,
                         policy=self.health_policy)

    def maybe_clear_condition(self, job_id: str, n: int, rows: Any) -> None:
        condition = self.conditions.get(job_id)
        steps = [int(x["step"]) for x in rows if x.get("step") is not None]
        if condition is None or condition.attempt != n or not steps \
                or not condition.cleared_by(max(steps)):
            return
        self.store.set_condition(job_id, None)
        self.conditions[job_id] = None
        self.store.add_event(job_id, kind=JobEventKind.INFO, reason=Reason.PROGRESS_RESUMED.value,
                             message=f"progress resumed at step {max(steps)}; no longer "
                             f"{condition.kind} ({condition.headline})",
                             data={"diagnosis_id": condition.diagnosis_id})

    # -- applying the restart policy --------------------------------------------------------
    def attempt_failed(self, job_id: str, n: int, *, reason: Reason, message: str,
                        data: dict[str, Any], final: bool = False,
                        user_error: bool = False) -> None:
        """Records attempt `n`'s failure (`data`: its AttemptFailure.event_data) and the
        restart policy's decision in one transaction (a report replayed after a restart
        changes nothing). `final`: the hang watchdog's action is fail."""
        def decide(job: JobRecord, attempts: list[AttemptRecord]) -> list[Move]:
            ended = [a for a in attempts if a.state == AttemptState.FAILED]
            checks = sum(1 for a in ended if a.failure_reason == Reason.PREFLIGHT_FAILED.value)
            decision = restart_decision(
                attempt=n, failed=len(ended) - checks, preflight_failed=checks, reason=reason,
                message=message, max_failures=job.spec.fault_tolerance.max_failures,
                hang_action=WatchdogAction.FAIL if final else None,
                cancelling=job.state == JobState.CANCELLING, user_error=user_error)
            if decision.outcome == Outcome.FINISH_CANCEL:
                return [(JobState.CANCELLED, Reason.WORKERS_STOPPED,
                         "workers stopped, placement group removed", None)]
            if decision.outcome == Outcome.RESTART:
                return [(JobState.RESTARTING, decision.reason, decision.message, data),
                        (JobState.QUEUED, Reason.RESTART_SCHEDULED, decision.requeue_message,
                         None)]
            return [(JobState.FAILED, decision.reason, decision.message, data)]

        self.store.fail_attempt(job_id, n, failure_reason=reason.value, message=message,
                                data=data, decide=decide)

    def move(self, job_id: str, dst: JobState, reason: Reason, message: str,
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

    def finish_cancel(self, job_id: str) -> None:
        self.move(job_id, JobState.CANCELLED, Reason.WORKERS_STOPPED,
                   "workers stopped, placement group removed")

    def requeue_preempted(self, job_id: str, how: str) -> None:
        """A preempted job's workers stopped: QUEUED again, to resume from its newest
        checkpoint when it fits (a preemption is not a failure: its restart budget stays)."""
        job = self.store.get_job(job_id)
        saved = [c.step for c in self.store.list_checkpoints(job_id) if not c.removed]
        at = f"its checkpoint at step {max(saved)}" if saved else "its start (no checkpoint)"
        self.move(job_id, JobState.QUEUED, Reason.PREEMPTED,
                  f"{how}; requeued: resumes from {at} when it fits again",
                  data={"attempt": job.current_attempt if job else None,
                        "resume_step": max(saved) if saved else None})

    def recover_metrics(self, job_id: str, attempt: int,
                        unreachable: tuple[str, ...] = ()) -> None:
        """The rows a failed or lost attempt's workers kept in their files and no poll
        fetched: reported after the last poll, or done since the last sync step. The nodes in
        `unreachable` (Ray node ids cut off from the controller) are not asked."""
        job = self.store.get_job(job_id)
        if self.runs_dir is None or not attempt or job is None:
            return
        try:
            ranks = {r.rank: r for r in self.store.list_ranks(job_id, attempt=attempt)}
            got = ingest_attempt_files(self.store, job_id=job_id, attempt=attempt,
                                       run_dir=self.runs_dir / job_id, world_size=job.world_size,
                                       nodes={r: x.node_id for r, x in ranks.items()},
                                       unreachable=unreachable)
        except Exception:  # noqa: BLE001 - recovering metrics must not block the restart
            log.exception("recovering the metrics of %s attempt %d failed", job_id, attempt)
            return
        for rank, why in sorted(got.unrecovered.items()):
            rec = ranks.get(rank)
            last = rec.step if rec else None  # the last step the polls saw it at
            self.store.add_event(
                job_id, kind=JobEventKind.WARNING, reason=Reason.METRICS_UNRECOVERED.value,
                message=f"rank {rank} on {rec.node if rec else 'an unknown node'}: the metric "
                f"rows it kept in its file past step {last or 0} are not recovered ({why}); "
                "they lived only on that host's disk",
                data={"attempt": attempt, "rank": rank, "node": rec.node if rec else None,
                      "last_seen_step": last})
