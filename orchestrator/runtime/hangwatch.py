"""The hang watchdog of one attempt, inside its controller: detect, collect evidence, analyze,
act. The attempt controller (orchestrator/runtime/controller.py) drives it:

    watch = AttemptWatchdog(cfg, emit=log.emit)   # when training is launched
    ended = watch.tick(gang, drained)             # every tick; a Failed when it ends the attempt
    watch.on_failures(gang, failures)             # before it stops the gang on a failure
    watch.open_report                             # the hang (or exit) diagnosed, if any

When to diagnose is the pure `orchestrator.watchdog.monitor.HangMonitor`. On a stall (or
silent heartbeats) every live worker answers `diagnostics()` on its own concurrency group with
one shared stamp, so the artifacts of a round share `run_dir/diagnostics/<stamp>/`; ranks whose
process died are evidence too (exit message + the op they announced before the call). The
report goes out as a `Diagnosis` event that the control plane stores; `tick` returns a `Failed`
when the spec says restart or fail. Nothing here raises into the controller.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.mesh import MeshShape
from orchestrator.runtime.events import AttemptConfig, Diagnosis, Failed, Payload, WatchdogError
from orchestrator.runtime.failures import RankFailure, mask_secrets
from orchestrator.runtime.gang import Drained, WorkerGang
from orchestrator.runtime.link_probe import measure_slow_links
from orchestrator.runtime.node_evidence import (
    NodeEvidence,
    gather_announcements,
    gather_node_evidence,
)
from orchestrator.spec import SpecKind, WatchdogAction
from orchestrator.watchdog.evidence_files import stamp_now
from orchestrator.watchdog.exits import first_line
from orchestrator.watchdog.hardware import with_driver_errors
from orchestrator.watchdog.inputs import resolve_announcements
from orchestrator.watchdog.locate import rank_locations
from orchestrator.watchdog.monitor import Action, Due, HangMonitor
from orchestrator.watchdog.report import DiagnosisReport, RankLocation, Verdict
from orchestrator.watchdog.slowdown import SlowdownWatch

_DIAG_TIMEOUT_S = 20.0  # the first Flight Recorder dump of a process can take seconds
_READ_TIMEOUT_S = 5.0  # a live node's answer to a file read
_PROBE_STAMP = "straggler-probe"
_ENDING_S = 3.0


class AttemptWatchdog:
    def __init__(self, cfg: AttemptConfig, *, emit: Callable[[Payload], None],
                 probe_interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.cfg = cfg
        self._emit = emit
        self._clock = clock
        self.monitor = HangMonitor.from_spec(cfg.spec.watchdog, world_size=cfg.world_size,
                                             now_s=clock(), probe_interval_s=probe_interval_s)
        self._rounds = itertools.count(1)
        # The newest hang (or exit) report of this attempt while no progress followed it:
        # an attempt that then fails takes its reason and message from it.
        self.open_report: DiagnosisReport | None = None
        # User code progresses by its reported steps, else by the collectives the probe in
        # each rank process samples; the probe answers the diagnostics of its worker actor.
        self._user_code = cfg.spec.kind is SpecKind.USER_CODE
        env = cfg.spec.entrypoint.env if cfg.spec.entrypoint is not None else None
        self._secrets = tuple(env.values()) if env else ()
        # A gang that slows down together (a slow link under a data-parallel all-reduce):
        # each host's link is measured then (runtime/link_probe.py).
        self.slowdown = SlowdownWatch()

    # -- controller hooks -------------------------------------------------------------------
    def tick(self, gang: WorkerGang, drained: Drained) -> Failed | None:
        """Feed one drain; on a due stall run a diagnosis round. Returns how the attempt ends
        when the spec's action is restart or fail."""
        try:
            now = self._clock()
            self.monitor.observe(now_s=now, metrics=drained.metrics, ranks=drained.ranks,
                                 collectives=drained.collectives)
            if not self.monitor.reported:
                self.open_report = None  # progress resumed: that hang is over
            due = self.monitor.due(now)
            if due is not None:
                return self._stall_round(gang, due)
            if self.monitor.probe_due(now):
                self._probe(gang)
            self.slowdown.observe(float(t) for row in drained.metrics
                                   if isinstance(t := row.get("step_time_s"), int | float))
            slower = self.slowdown.due(now_s=now)
            if slower is not None:
                for event in measure_slow_links(gang, slower=slower):
                    self._emit(event)
        except Exception as exc:  # noqa: BLE001 - the watchdog never takes the attempt down
            self._error(exc)
        return None

    def on_failures(self, gang: WorkerGang, failures: list[RankFailure]) -> None:
        """A rank's process died or its training raised: when peers are left waiting on it,
        diagnose before the gang is stopped (their stacks and traces show the wait)."""
        try:
            if self.monitor.reported:
                return  # a hang was already diagnosed; its fallout (timeouts) is not news
            if any(f.error_type == "PreflightFailed" for f in failures):
                return  # the pre-flight check failed (the attempt says where): no code ran
            died = {f.rank: f.message or "process died" for f in failures if f.died}
            failed = {f.rank: f for f in failures}
            running = [r for r in gang.ranks if r not in failed]
            # User code that loaded and ran (not a setup error) is diagnosed even before its
            # first sampled collective: gloo aborts a size mismatch within a step.
            progressed = any(r in gang.last_steps() for r in running) or (
                self._user_code and (self.monitor.has_progress()
                                     or not all(f.setup_error for f in failures)))
            if not died and not progressed:
                return  # a setup error on every rank is a failure, not a hang
            early = _finished_early(gang, failed)
            if early:
                # A rank that returned (exit 0) while its peers still ran: the peers' errors
                # (gloo: "Connection closed by peer") are its fallout, not the cause.
                dead, times = early
            elif died:
                dead = died
                times = {r: failed[r].time for r in died}
            else:
                dead = {r: f"{f.error_type}: {first_line(f.message)}" for r, f in failed.items()}
                times = {r: f.time for r, f in failed.items()}
            report = self._round(gang, trigger="stall", dead=dead, exit_times=times,
                                 context=f"{len(failed)} rank(s) ended while "
                                 f"{len(running)} were still running")
            self.monitor.mark_reported()
            self.open_report = report
            self._publish(report, trigger="exit")
        except Exception as exc:  # noqa: BLE001
            self._error(exc)

    # -- rounds -----------------------------------------------------------------------------
    def _stall_round(self, gang: WorkerGang, due: Due) -> Failed | None:
        detected = time.time()
        if self._ending(gang):
            return None  # the last ranks are leaving: the end of a job, not a hang
        report = self._round(gang, trigger="stall", context=due.describe())
        if self._ended_cleanly(gang):
            return None  # every rank completed while the round ran: the job ended, no hang
        self.monitor.mark_reported()
        if report.verdict is not Verdict.STRAGGLER:
            self.open_report = report
        self._publish(report, trigger=due.trigger, detected_at=detected)
        nodes = {r: info.node for r, info in gang.ranks.items()}
        act = self.monitor.decide(report, rank_nodes=nodes)
        return None if act.kind == WatchdogAction.OBSERVE else _ended_by(act)

    def _ending(self, gang: WorkerGang) -> bool:
        """Some ranks completed and none failed: wait (bounded) for the others, which may
        still be tearing down (destroy_process_group, interpreter exit). True when every
        rank then completed."""
        gang.wait(timeout_s=0.2)
        if not gang.finished() or gang.failures():
            return False
        deadline = time.monotonic() + _ENDING_S
        while not gang.all_done() and not gang.failures() and time.monotonic() < deadline:
            gang.wait(timeout_s=0.2)
        return gang.all_done()

    @staticmethod
    def _ended_cleanly(gang: WorkerGang) -> bool:
        gang.wait(timeout_s=0.2)
        return gang.all_done() and not gang.failures()

    def _probe(self, gang: WorkerGang) -> None:
        report = self._round(gang, trigger="straggler", stamp=_PROBE_STAMP,
                             context="periodic time-to-enter probe")
        if self.monitor.keep_straggler(report):
            self._publish(report, trigger="straggler")

    def _round(self, gang: WorkerGang, *, trigger: str, context: str, stamp: str | None = None,
               dead: Mapping[int, str] | None = None,
               exit_times: Mapping[int, float] | None = None) -> DiagnosisReport:
        stamp = stamp or f"{stamp_now()}-{next(self._rounds)}"
        # A straggler probe reads when each rank entered its collectives, on a job that is
        # training: no py-spy dump, which would stop every rank for the seconds it takes.
        replies = gang.diagnostics(request={"stamp": stamp, "native": trigger != "straggler"},
                                   timeout_s=_DIAG_TIMEOUT_S)
        dead = dict(dead or {})
        if trigger != "straggler" and not dead:
            # Ranks that ended before or while this round ran (a stall's cause can be a rank
            # that returned early; its peers then fail of it) are dead, not silent.
            gang.wait(timeout_s=0.2)
            failed = {f.rank: f for f in gang.failures()}
            early = _finished_early(gang, failed)
            if early:
                dead, exit_times = early
            elif failed:
                dead = {r: f"{f.error_type}: {first_line(f.message)}" for r, f in failed.items()}
                exit_times = {r: f.time for r, f in failed.items()}
        secrets = self._secrets
        dead = {r: mask_secrets(info, secrets) for r, info in dead.items()}
        summaries: dict[int, dict[str, Any]] = {}
        for r, reply in replies.items():
            s = _summary(r, reply)
            if s is not None and r not in dead:
                summaries[r] = s
        # ranks that ended or stay silent, and the dead: their last announced op, read on
        # their nodes, but for the cut-off ranks' (their hosts answer no read either)
        cut_off = set(unreachable_ranks(replies)) | gang.unreachable
        wanted = [r for r in gang.ranks if r not in summaries and r not in cut_off]
        announced = gather_announcements({r: gang.ranks[r].node_id for r in wanted},
                                         run_dir=self.cfg.run_dir, timeout_s=_READ_TIMEOUT_S)
        for r in wanted:
            if r not in dead and r in announced:
                summaries[r] = {"rank": r, "pending": [announced[r]]}
        anns = {r: announced[r] for r in dead if r in announced}
        summaries, anns = resolve_announcements(summaries, anns)  # op id -> collective seq
        nodes = (self._node_evidence(gang, stamp, skip=cut_off) if trigger != "straggler"
                 else NodeEvidence())
        locations = self._locations(gang)
        report = self.monitor.analysis(
            summaries=summaries, dead=dead, exit_times=exit_times, announcements=anns,
            locations=locations,
            trigger=trigger, artifacts=tuple(nodes.paths), context=context)
        report = with_driver_errors(report, nodes.gpus, locations)
        if exit_times:
            report = _with_exit_times(report, exit_times)
        silent = {r: gang.ranks[r].node or "?" for r in unreachable_ranks(replies)
                  if r not in dead and r in gang.ranks}
        return _with_unreachable(report, silent, {r: gang.silent_s(r) for r in silent}
                                 ) if silent else report

    def _publish(self, report: DiagnosisReport, *, trigger: str,
                 detected_at: float | None = None) -> None:
        self._emit(Diagnosis(report=report, trigger=trigger,
                             detected_at=detected_at or time.time()))

    def _error(self, exc: Exception) -> None:
        self._emit(WatchdogError(message=f"{type(exc).__name__}: {exc}",
                                 traceback=traceback.format_exc()[-2000:]))

    # -- helpers ----------------------------------------------------------------------------
    def _locations(self, gang: WorkerGang) -> dict[int, RankLocation]:
        assignment = {r: (str(info.node or info.node_id or "?"), info.gpu)
                      for r, info in gang.ranks.items()}
        return rank_locations(assignment=assignment, topology=self.cfg.cluster,
                              mesh_dims=MeshShape.from_parallelism(self.cfg.spec.parallelism)
                              .as_dict())

    def _node_evidence(self, gang: WorkerGang, stamp: str, *, skip: set[int]) -> NodeEvidence:
        """`nvidia-smi -q` and the kernel's Xid lines once per node of a GPU job, but for the
        nodes of the ranks in `skip` (unreachable: they would answer no read either)."""
        if all(b.gpu is None for b in self.cfg.bundles):
            return NodeEvidence()
        cut = {str(gang.ranks[r].node_id) for r in skip if r in gang.ranks}
        nodes = {str(info.node_id): info.node for info in gang.ranks.values()
                 if str(info.node_id) not in cut}
        return gather_node_evidence(nodes, run_dir=self.cfg.run_dir, stamp=stamp,
                                    timeout_s=_DIAG_TIMEOUT_S)


def _summary(rank: int, reply: Any) -> dict[str, Any] | None:
    """The worker's evidence summary; without one (collection failed, run ended) what the
    reply still says: the heartbeat and the stacks."""
    if not isinstance(reply, Mapping) or "error" in reply and len(reply) == 1:
        return None
    ev = reply.get("evidence")
    if isinstance(ev, Mapping):
        return dict(ev, rank=rank)
    if reply.get("state") != "running":
        return None  # the run is over: its exit is reported through the failure path
    hb = reply.get("heartbeat")
    stacks = reply.get("stacks") or {}
    return {"rank": rank, "step": hb.step if hb else None, "phase": hb.phase if hb else None,
            "main_stack": "\n".join(f"--- {k} ---\n{v}" for k, v in stacks.items()) or None}


_EXITED_0 = "exit code 0 while its peers were still running"


def _finished_early(gang: WorkerGang, failed: Mapping[int, RankFailure]
                    ) -> tuple[dict[int, str], dict[int, float]] | None:
    """Ranks that completed (exit 0) while others failed, with their end times (a rank whose
    peer is gone errors out of its next collective; it does not exit 0)."""
    done = {r: res for r, res in gang.finished().items() if r not in failed}
    if not done:
        return None
    return {r: _EXITED_0 for r in done}, {r: float(res.time or 0.0) for r, res in done.items()}


def unreachable_ranks(replies: Mapping[int, Any]) -> list[int]:
    """Ranks whose worker answered no diagnostics call: the call timed out or Ray could not
    reach the actor (its host is down or cut off). A live worker answers even while its
    training thread is blocked in a collective."""
    return sorted(r for r, x in replies.items() if isinstance(x, Mapping) and len(x) == 1
                  and any(k in str(x.get("error", "")) for k in
                          ("GetTimeoutError", "ActorUnavailableError", "unavailable")))


def _with_unreachable(report: DiagnosisReport, nodes: Mapping[int, str],
                      silent_s: Mapping[int, float] | None = None) -> DiagnosisReport:
    """The report with the unreachable ranks' hosts named in its summary and details;
    `silent_s`: per rank, how long it has answered no poll while its peers did."""
    d = report.to_dict()
    hosts = sorted(set(nodes.values()))
    ranks = sorted(nodes)
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    longest = max((silent_s or {}).values(), default=0.0)
    polls = (f"no poll for {longest:.0f} s while the other ranks answered, and "
             if longest >= 1 else "")
    d["summary"] = (f"{d['summary']} {'Host' if len(hosts) == 1 else 'Hosts'} "
                    f"{', '.join(hosts)} unreachable: {who} answered {polls}"
                    "no diagnostics call.")
    d["details"] = {**d.get("details", {}), "unreachable": {str(r): n for r, n in nodes.items()}}
    return DiagnosisReport.from_dict(d)


def _with_exit_times(report: DiagnosisReport, times: Mapping[int, float]) -> DiagnosisReport:
    d = report.to_dict()
    d["details"] = {**d.get("details", {}), "exit_times": {str(k): v for k, v in times.items()}}
    return DiagnosisReport.from_dict(d)


def _ended_by(act: Action) -> Failed:
    """The attempt's end for a hang action: "fail" ends the job, "restart" counts as a failed
    attempt whose next one avoids the suspect nodes."""
    return Failed(reason=act.reason, message=f"hang detected: {act.message}",
                  failed_nodes=act.avoid_nodes, avoid_nodes=act.avoid_nodes,
                  hang_action=act.kind)
