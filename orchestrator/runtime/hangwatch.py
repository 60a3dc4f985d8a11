"""The controller's hang watchdog driver (issue 6): detect, collect evidence, analyze, act.

The attempt controller (orchestrator/runtime/controller.py) calls it from its supervise loop:

    watch = HangWatch(cfg, emit=log.emit)         # when training is launched
    act = watch.tick(gang, drained)               # every tick, with what it drained
    watch.on_failures(gang, failures)             # before it stops the gang on a failure

Detection is the pure `orchestrator.watchdog.monitor.HangMonitor`. On a stall (or silent
heartbeats) every live worker answers `diagnostics()` on its own concurrency group with one
shared stamp, so the artifacts of a round share `run_dir/diagnostics/<stamp>/`; ranks whose
process died are evidence too (exit message + the op they announced before the call). The
report goes out as a `diagnosis` event that the control plane stores; `tick` returns an
`Action` when the spec says restart or fail. Nothing here raises into the controller.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.runtime.gang import AttemptConfig
from orchestrator.watchdog.inputs import resolve_announcements
from orchestrator.watchdog.monitor import Action, Due, HangMonitor
from orchestrator.watchdog.report import DiagnosisReport, RankLocation

_DIAG_TIMEOUT_S = 20.0  # the first Flight Recorder dump of a process can take seconds
_PROBE_STAMP = "straggler-probe"


def _announcement(run_dir: str, rank: int) -> dict[str, Any] | None:
    from workers.diagnostics import read_announcement

    return read_announcement(run_dir, rank)


class HangWatch:
    def __init__(self, cfg: AttemptConfig, *, emit: Callable[..., None],
                 probe_interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.cfg = cfg
        self._emit = emit
        self._clock = clock
        world = len(cfg.bundles)
        self.monitor = HangMonitor.from_spec(cfg.spec, world_size=world, now_s=clock(),
                                             probe_interval_s=probe_interval_s)
        self._rounds = itertools.count(1)

    # -- controller hooks -------------------------------------------------------------------
    def tick(self, gang: Any, drained: Mapping[str, Any]) -> Action | None:
        """Feed one drain; on a due stall run a diagnosis round. Returns an action to take."""
        try:
            now = self._clock()
            self.monitor.observe(now_s=now, metrics=drained.get("metrics") or (),
                                 ranks=drained.get("ranks") or {})
            due = self.monitor.due(now)
            if due is not None:
                return self._stall_round(gang, due)
            if self.monitor.probe_due(now):
                self._probe(gang)
        except Exception as exc:  # noqa: BLE001 - the watchdog never takes the attempt down
            self._emit("watchdog_error", message=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc()[-2000:])
        return None

    def on_failures(self, gang: Any, failures: list[dict[str, Any]]) -> None:
        """A rank's process died or its training raised: when peers are left waiting on it,
        diagnose before the gang is stopped (their stacks and traces show the wait)."""
        try:
            if self.monitor.reported:
                return  # a hang was already diagnosed; its fallout (timeouts) is not news
            died = {int(f["rank"]): str(f.get("message") or "process died") for f in failures
                    if f.get("error_type") == "WorkerDied"}
            failed = {int(f["rank"]): f for f in failures}
            running = [r for r in gang.ranks if r not in failed]
            if not died and not any(self._past_setup(gang, r) for r in running):
                return  # a setup error on every rank is a failure, not a hang
            if died:
                dead = {r: died[r] for r in died}
                times = {r: float(failed[r].get("time") or 0.0) for r in died}
            else:
                dead = {r: f"{f.get('error_type')}: {str(f.get('message'))[:300]}"
                        for r, f in failed.items()}
                times = {r: float(f.get("time") or 0.0) for r, f in failed.items()}
            report = self._round(gang, trigger="stall", dead=dead, exit_times=times,
                                 context=f"{len(failed)} rank(s) ended while "
                                 f"{len(running)} were still running")
            self.monitor.mark_reported()
            self._publish(report, trigger="exit")
        except Exception as exc:  # noqa: BLE001
            self._emit("watchdog_error", message=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc()[-2000:])

    # -- rounds -----------------------------------------------------------------------------
    def _stall_round(self, gang: Any, due: Due) -> Action | None:
        detected = time.time()
        report = self._round(gang, trigger="stall", context=due.describe())
        self.monitor.mark_reported()
        self._publish(report, trigger=due.trigger, detected_at=detected)
        nodes = {r: info.get("node") for r, info in gang.ranks.items()}
        act = self.monitor.decide(report, rank_nodes=nodes)
        return None if act.kind == "observe" else act

    def _probe(self, gang: Any) -> None:
        report = self._round(gang, trigger="straggler", stamp=_PROBE_STAMP,
                             context="periodic time-to-enter probe")
        if self.monitor.keep_straggler(report):
            self._publish(report, trigger="straggler")

    def _round(self, gang: Any, *, trigger: str, context: str, stamp: str | None = None,
               dead: Mapping[int, str] | None = None,
               exit_times: Mapping[int, float] | None = None) -> DiagnosisReport:
        from workers.diagnostics import stamp_now

        stamp = stamp or f"{stamp_now()}-{next(self._rounds)}"
        replies = gang.diagnostics(request={"stamp": stamp}, timeout_s=_DIAG_TIMEOUT_S)
        dead = dict(dead or {})
        summaries: dict[int, dict[str, Any]] = {}
        for r, reply in replies.items():
            s = _summary(r, reply)
            if s is not None and r not in dead:
                summaries[r] = s
        for r in gang.ranks:
            if r in summaries or r in dead:
                continue
            ann = _announcement(self.cfg.run_dir, r)  # ended, silent: its last announced op
            if ann is not None:
                summaries[r] = {"rank": r, "pending": [ann]}
        anns = {r: a for r in dead if (a := _announcement(self.cfg.run_dir, r)) is not None}
        summaries, anns = resolve_announcements(summaries, anns)  # op id -> collective seq
        artifacts = tuple(self._node_evidence(gang, stamp)) if trigger != "straggler" else ()
        report = self.monitor.analysis(
            summaries=summaries, dead=dead, announcements=anns, locations=self._locations(gang),
            trigger=trigger, artifacts=artifacts, context=context)
        if exit_times:
            report = _with_exit_times(report, exit_times)
        return report

    def _publish(self, report: DiagnosisReport, *, trigger: str,
                 detected_at: float | None = None) -> None:
        self._emit("diagnosis", report=report.to_dict(), trigger=trigger,
                   detected_at=detected_at or time.time())

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _past_setup(gang: Any, rank: int) -> bool:
        return rank in gang.last_steps()

    def _locations(self, gang: Any) -> dict[int, RankLocation]:
        from orchestrator.watchdog.locate import rank_locations

        topology = None
        if self.cfg.cluster is not None:
            try:
                from orchestrator.topology.declared import parse_cluster_doc

                topology = parse_cluster_doc(self.cfg.cluster)
            except Exception:  # noqa: BLE001 - labels are a nicety
                topology = None
        assignment = {r: (str(info.get("node") or info.get("node_id") or "?"), info.get("gpu"))
                      for r, info in gang.ranks.items()}
        dims = {k: int(v) for k, v in (self.cfg.spec.get("parallelism") or {}).items()
                if k in ("pp", "dp_replicate", "dp_shard", "tp") and isinstance(v, int)}
        return rank_locations(assignment=assignment, topology=topology, mesh_dims=dims)

    def _node_evidence(self, gang: Any, stamp: str) -> list[str]:
        """`nvidia-smi -q` once per node of a GPU job, from a task pinned to that node."""
        if not any(b.get("resources", {}).get("GPU") for b in self.cfg.bundles):
            return []
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from workers.diagnostics import collect_node_evidence

        task: Any = ray.remote(num_cpus=0)(collect_node_evidence)  # type: ignore[arg-type]
        nodes = {info["node_id"]: info.get("node") for info in gang.ranks.values()}
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False))
                .remote(self.cfg.run_dir, stamp=stamp, node=name) for nid, name in nodes.items()]
        out: list[str] = []
        for ref in refs:
            try:
                out.extend(ray.get(ref, timeout=_DIAG_TIMEOUT_S))
            except Exception:  # noqa: BLE001 - a missing nvidia-smi dump is not fatal
                continue
        return out


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
    hb = reply.get("heartbeat") or {}
    stacks = reply.get("stacks") or {}
    return {"rank": rank, "step": hb.get("step"), "phase": hb.get("phase"),
            "main_stack": "\n".join(f"--- {k} ---\n{v}" for k, v in stacks.items()) or None}


def _with_exit_times(report: DiagnosisReport, times: Mapping[int, float]) -> DiagnosisReport:
    d = report.to_dict()
    d["details"] = {**d.get("details", {}), "exit_times": {str(k): v for k, v in times.items()}}
    return DiagnosisReport.from_dict(d)


def finish_data(act: Action) -> dict[str, Any]:
    """The controller's `failed` event for a hang action (the poller reads `hang_action`:
    "fail" ends the job, "restart" counts as a failed attempt)."""
    return {"reason": act.reason, "message": f"hang detected: {act.message}", "groups": [],
            "failed_nodes": list(act.avoid_nodes), "hang_action": act.kind,
            "avoid_nodes": list(act.avoid_nodes)}
