"""The scheduler loop: queued jobs → gang reservation (one placement group) + a controller.

Order: priority (higher first), then FIFO (submission order). Every queued job is tried in
that order against what is still free after the jobs placed before it in the same tick; a job
that does not fit records why (`pending_reason`, with numbers) and the scan goes on, so an
infeasible or large job never blocks smaller ones behind it (no head-of-line blocking). The
price is that a large waiting job can be overtaken by smaller ones while it waits.

Placing a job: QUEUED → PLACING (reason PLACEMENT_FOUND, the solver's summary), a new attempt
with the plan, one detached named placement group with a bundle per rank pinned to the
planned node (`bundle_label_selector` on `ray.io/node-id`), then the attempt's controller,
which waits for the group (spec.placement.timeout_s) and reports back through the poller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group

from orchestrator.lifecycle import JobState, Reason
from orchestrator.placement.gang_plan import GangPlan, Pending, plan_job
from orchestrator.placement.links import LinkFigures
from orchestrator.placement.snapshot import (
    Inventory,
    build_inventory,
    read_ray_nodes,
    reserved_gpus,
)
from orchestrator.runtime.controller import launch_controller, pg_name
from orchestrator.runtime.failures import nodes_failed_twice
from orchestrator.spec import JobSpec, parse_spec
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from orchestrator.topology.model import ClusterTopology

log = logging.getLogger("meshyard.scheduler")


class Scheduler:
    def __init__(self, *, store: Store, runs_dir: Path,
                 declared: Callable[[], ClusterTopology | None],
                 near_node_id: str | None = None, train_fn: str | None = None,
                 extra_env: dict[str, str] | None = None,
                 launching: set[str] | None = None, use_pool: bool = False,
                 figures: Callable[[], LinkFigures | None] | None = None) -> None:
        self.store = store
        # link figures for the cost model: calibrated ones (meshyard calibrate) when present
        self._figures = figures or (lambda: None)
        self.use_pool = use_pool
        self.launching = launching if launching is not None else set()
        self.runs_dir = runs_dir.resolve()
        self._declared = declared
        self.near_node_id = near_node_id
        self.train_fn = train_fn
        self.extra_env = dict(extra_env or {})

    # -- inventory ----------------------------------------------------------------------------
    def inventory(self) -> Inventory:
        busy: dict[str, list[int]] = {}
        for job in self.store.active_jobs():
            for node_id, gpus in self._held_gpus(job).items():
                busy.setdefault(node_id, []).extend(gpus)
        return build_inventory(ray_nodes=read_ray_nodes(ray), declared=self._declared(),
                               busy=busy)

    def _held_gpus(self, job: JobRecord) -> dict[str, list[int]]:
        """GPUs an active job holds: where its ranks really are, else its plan."""
        if job.current_attempt == 0:
            return {}
        ranks = self.store.list_ranks(job.id, attempt=job.current_attempt)
        if ranks and all(r.node_id and r.gpu is not None for r in ranks):
            out: dict[str, list[int]] = {}
            for r in ranks:
                out.setdefault(str(r.node_id), []).append(int(r.gpu))  # type: ignore[arg-type]
            return out
        attempt = next((a for a in self.store.list_attempts(job.id)
                        if a.number == job.current_attempt), None)
        return reserved_gpus([attempt.placement or {}]) if attempt else {}

    # -- one pass -----------------------------------------------------------------------------
    def tick(self) -> list[str]:
        """Tries every queued job once; returns the ids placed in this pass."""
        queued = self.store.queued_jobs()
        if not queued:
            return []
        inv = self.inventory()
        placed = []
        for job in queued:
            try:
                spec = parse_spec(job.spec)
            except ValueError as exc:  # a stored spec that no longer parses: fail it loudly
                self.store.transition(job.id, JobState.FAILED, reason=Reason.SETUP_ERROR,
                                      message=f"stored spec is invalid: {exc}")
                continue
            decision = plan_job(spec, inv, avoid=self._avoid(job), figures=self._figures())
            if isinstance(decision, Pending):
                self._set_pending(job, decision)
                continue
            self.launching.add(job.id)
            try:
                self._launch(job, spec, decision, inv)
            except Exception:  # noqa: BLE001 - Ray refused: the poller requeues it
                log.exception("launching %s failed", job.id)
                continue
            finally:
                self.launching.discard(job.id)
            placed.append(job.id)
            inv = inv.reserve(gpus=decision.gpus_by_node(), cpus=decision.cpus_by_node())
        return placed

    def _avoid(self, job: JobRecord) -> set[str]:
        if job.current_attempt < 1:
            return set()
        events = [e for e in self.store.list_events(job.id) if e.kind == "error"]
        # The hang watchdog names a suspect node at once (COMM_WEDGED with hardware evidence).
        suspects = {n for e in events for n in e.data.get("avoid_nodes", [])}
        if job.current_attempt < 2:
            return suspects
        per_attempt = [e.data.get("failed_nodes", []) for e in events if "failed_nodes" in e.data]
        return nodes_failed_twice(per_attempt) | suspects

    def _set_pending(self, job: JobRecord, pending: Pending) -> None:
        reason = pending.to_dict()
        if job.pending_reason != reason:
            self.store.set_pending_reason(job.id, reason)

    def _launch(self, job: JobRecord, spec: JobSpec, plan: GangPlan, inv: Inventory) -> None:
        number = job.current_attempt + 1
        name = pg_name(job.id, number)
        self.store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND,
                              message=plan.summary, data={"attempt": number, "pg": name})
        placement = dict(plan.to_dict(), pg_name=name)
        attempt = self.store.start_attempt(job.id, placement=placement)
        assert attempt.number == number, (attempt.number, number)
        placement_group(
            [b["resources"] for b in plan.bundles],
            bundle_label_selector=[{"ray.io/node-id": b["node_id"]} for b in plan.bundles],
            name=name, lifetime="detached")
        launch_controller(self._config(job, spec, plan, number, inv),
                          near_node_id=self.near_node_id)
        log.info("job %s attempt %d: %s", job.id, number, plan.summary)

    def _config(self, job: JobRecord, spec: JobSpec, plan: GangPlan, number: int,
                inv: Inventory) -> dict[str, Any]:
        cluster = None
        if plan.device == "gpu":
            from orchestrator.topology.declared import cluster_to_dict

            used = {b["node"] for b in plan.bundles}
            cluster = cluster_to_dict(ClusterTopology(
                levels=inv.cluster.levels,
                nodes=tuple(n for n in inv.cluster.nodes if n.name in used)))
        return {
            "job_id": job.id, "attempt": number, "spec": job.spec, "pg_name": pg_name(job.id,
                                                                                    number),
            "bundles": [dict(b) for b in plan.bundles],
            "run_dir": str(self.runs_dir / job.id),
            "placement_timeout_s": spec.placement.timeout_s,
            "init_timeout_s": min(spec.fault_tolerance.init_timeout_s, 600.0),
            "train_fn": self.train_fn, "extra_env": self.extra_env, "cluster": cluster,
            "use_pool": self.use_pool,
        }
