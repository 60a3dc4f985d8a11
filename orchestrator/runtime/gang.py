"""One attempt's worker gang, driven by the controller (orchestrator/runtime/controller.py).

`AttemptConfig` is what the scheduler hands the controller; `WorkerGang` creates the worker
actors on the placement-group bundles, assigns ranks from where they really landed, launches
training and turns polls / results / actor deaths into plain dicts for the controller's log.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.mesh import MeshShape
from orchestrator.placement.ranks import bundle_ranks

_POLL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AttemptConfig:
    job_id: str
    attempt: int
    spec: dict[str, Any]
    pg_name: str
    bundles: list[dict[str, Any]]  # per bundle: rank, node, node_id, gpu, resources
    run_dir: str
    placement_timeout_s: float
    init_timeout_s: float
    train_fn: str | None = None
    steps: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    cluster: dict[str, Any] | None = None  # cluster_to_dict of the nodes used (GPU jobs)
    use_pool: bool = False  # lease warm actors for CPU bundles (orchestrator/runtime/pool.py)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttemptConfig:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @property
    def log_dir(self) -> str:
        return f"{self.run_dir}/logs/attempt-{self.attempt}"


def _death_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = next((line.strip() for line in text if "exit" in line.lower()
                   or "died" in line.lower() or "killed" in line.lower()), text[0] if text else "")
    return f"worker process died: {detail[:300]}"


class WorkerGang:
    def __init__(self, cfg: AttemptConfig, *, cancel: Any) -> None:
        self.cfg = cfg
        self._cancel = cancel
        self.workers: dict[int, Any] = {}
        self.ranks: dict[int, dict[str, Any]] = {}
        self.master: dict[str, Any] = {}
        self._refs: dict[Any, int] = {}
        self._results: dict[int, dict[str, Any]] = {}
        self._dead: set[int] = set()
        self._last_step: dict[int, int] = {}
        self._actors: list[Any] = []
        self._pooled: dict[str, list[Any]] = {}  # node id → leased warm actors

    # -- start ------------------------------------------------------------------------------
    def create(self) -> list[dict[str, Any]] | None:
        """Creates the actors, reads where each landed and assigns ranks; None if cancelled."""
        from workers.actor import WorkerActor

        pg = ray.util.get_placement_group(self.cfg.pg_name)
        pooled = self._lease_pooled()
        actors = []
        for i, b in enumerate(self.cfg.bundles):
            res = b["resources"]
            if i in pooled:
                actors.append(pooled[i])
                continue
            actors.append(WorkerActor.options(  # type: ignore[attr-defined]
                num_cpus=res.get("CPU", 0), num_gpus=res.get("GPU", 0), max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=i),
            ).remote())
        self._actors = actors
        infos = self._gather([a.info.remote() for a in actors], self.cfg.init_timeout_s)
        if infos is None:
            self.kill()
            return None
        landed = [dict(info, bundle=i) for i, info in enumerate(infos)]
        by_bundle = self._ranks_for(landed)
        p = self.cfg.spec.get("parallelism", {})
        mesh = MeshShape(**{k: int(p.get(k, 1)) for k in ("pp", "dp_replicate", "dp_shard",
                                                         "tp")})
        for i, rank in by_bundle.items():
            info, plan = landed[i], self.cfg.bundles[i]
            gpu = info["gpu_ids"][0] if info["gpu_ids"] else None
            self.workers[rank] = actors[i]
            self.ranks[rank] = {"rank": rank, "node": plan.get("node"), "node_id": info["node_id"],
                                "gpu": gpu, "coords": mesh.coords(rank),
                                "pid": info["pid"], "ip": info["ip"], "bundle": i}
        rank0 = self.workers[0]
        port = ray.get(rank0.free_port.remote(), timeout=_POLL_TIMEOUT_S * 6)
        self.master = {"addr": self.ranks[0]["ip"], "port": port}
        return [dict(self.ranks[r]) for r in sorted(self.ranks)]

    def _lease_pooled(self) -> dict[int, Any]:
        """Bundle index → a warm pooled actor on the bundle's node (CPU bundles only)."""
        if not self.cfg.use_pool or any(b["resources"].get("GPU") for b in self.cfg.bundles):
            return {}
        from orchestrator.runtime.pool import find_pool

        pool = find_pool()
        if pool is None:
            return {}
        by_node: dict[str, list[int]] = {}
        for i, b in enumerate(self.cfg.bundles):
            by_node.setdefault(b["node_id"], []).append(i)
        out: dict[int, Any] = {}
        for node, idxs in by_node.items():
            try:
                got = ray.get(pool.lease.remote(node, len(idxs)), timeout=_POLL_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                continue
            self._pooled.setdefault(node, []).extend(got)
            out.update(zip(idxs, got, strict=False))
        return out

    def _ranks_for(self, landed: list[dict[str, Any]]) -> dict[int, int]:
        """Bundle index → rank, from where each actor landed (the placement module's rules
        for GPU jobs; planned order for CPU jobs)."""
        if self.cfg.cluster is None or not all(x["gpu_ids"] for x in landed):
            return bundle_ranks(bundles=self.cfg.bundles, landed=landed)
        from orchestrator.mesh import MeshShape
        from orchestrator.placement.ranks import RankPlacement, ranks_for_actors
        from orchestrator.topology.declared import parse_cluster_doc

        cluster = parse_cluster_doc(self.cfg.cluster)
        p = self.cfg.spec.get("parallelism", {})
        mesh = MeshShape(**{k: int(p.get(k, 1)) for k in ("pp", "dp_replicate", "dp_shard",
                                                         "tp")})
        planned = [RankPlacement(rank=b["rank"], node=b["node"], node_key=b["node_id"],
                                 gpu=b["gpu"], coords=b.get("coords", {}))
                   for b in self.cfg.bundles]
        tp_within = self.cfg.spec.get("placement", {}).get("tp_within", "nvlink_domain")
        actors = [(x["node_id"], x["gpu_ids"][0]) for x in landed]
        ranks = ranks_for_actors(cluster, mesh, actors, planned=planned, tp_within=tp_within)
        return dict(enumerate(ranks))

    def _gather(self, refs: list[Any], timeout_s: float) -> list[Any] | None:
        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            if self._cancel.is_set():
                return None
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.25)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} of {len(refs)} workers did not start "
                                   f"within {timeout_s:g} s")
        return ray.get(refs)

    def launch(self) -> None:
        world = len(self.ranks)
        per_node: dict[str, list[int]] = {}
        for r in sorted(self.ranks):
            per_node.setdefault(self.ranks[r]["node_id"], []).append(r)
        for r, w in self.workers.items():
            peers = per_node[self.ranks[r]["node_id"]]
            assignment = {
                "rank": r, "attempt": self.cfg.attempt, "spec": self.cfg.spec,
                "run_dir": self.cfg.run_dir,
                "log_dir": self.cfg.log_dir, "train_fn": self.cfg.train_fn,
                "steps": self.cfg.steps,
                "dist": {"rank": r, "local_rank": peers.index(r), "world_size": world,
                         "local_world_size": len(peers), "master_addr": self.master["addr"],
                         "master_port": self.master["port"]},
                "env": dict(self.cfg.extra_env, MESHYARD_JOB_ID=self.cfg.job_id,
                            MESHYARD_ATTEMPT=str(self.cfg.attempt)),
            }
            self._refs[w.run.remote(assignment)] = r

    # -- supervise --------------------------------------------------------------------------
    def wait(self, *, timeout_s: float) -> bool:
        """Collects finished runs; True when at least one finished in this call."""
        pending = [ref for ref, r in self._refs.items() if r not in self._results]
        if not pending:
            return True
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
        for ref in done:
            rank = self._refs[ref]
            try:
                self._results[rank] = ray.get(ref)
            except RayActorError as exc:
                self._dead.add(rank)
                self._results[rank] = {"status": "error", "rank": rank,
                                       "error_type": "WorkerDied", "message": _death_message(exc)}
            except RayError as exc:
                self._results[rank] = {"status": "error", "rank": rank,
                                       "error_type": type(exc).__name__, "message": str(exc)}
            self._results[rank].setdefault("time", time.time())
        return bool(done)

    def drain(self) -> dict[str, Any]:
        """Polls every live worker: metrics, log lines, heartbeats, per-rank updates."""
        live = {r: w for r, w in self.workers.items() if r not in self._dead}
        refs = {r: w.poll.remote() for r, w in live.items()}
        out: dict[str, Any] = {"metrics": [], "logs": [], "ranks": {}}
        for r, ref in refs.items():
            try:
                p = ray.get(ref, timeout=_POLL_TIMEOUT_S)
            except (RayActorError, GetTimeoutError, RayError):
                continue  # the run ref reports the death; a slow poll is retried next tick
            out["metrics"].extend(p["metrics"])
            out["logs"].extend(p["logs"])
            upd: dict[str, Any] = {"state": p["state"].upper()}
            if p["metrics"]:
                self._last_step[r] = int(p["metrics"][-1].get("step", 0))
            hb = p.get("heartbeat")
            if hb:
                upd.update(step=hb.get("step"), phase=hb.get("phase"),
                           last_heartbeat=hb.get("time"), pid=hb.get("pid"))
            elif r in self._last_step:
                upd["step"] = self._last_step[r]
            out["ranks"][r] = upd
        for r, res in self._results.items():
            if res.get("status") == "error":
                out["ranks"].setdefault(r, {})["state"] = "FAILED"
        return out

    def last_steps(self) -> dict[int, int]:
        return dict(self._last_step)

    def failures(self) -> list[dict[str, Any]]:
        fs = [dict(res, node=self.ranks[r]["node"], node_id=self.ranks[r]["node_id"])
              for r, res in self._results.items() if res.get("status") == "error"]
        return sorted(fs, key=lambda f: (f.get("time", 0.0), f["rank"]))

    def all_done(self) -> bool:
        return len(self._results) == len(self._refs) and not self.failures()

    def results(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in self._results[r].items() if k != "result"}
                for r in sorted(self._results)]

    def stop_all(self, *, grace_s: float) -> None:
        for r, w in self.workers.items():
            if r not in self._results:
                w.stop.remote()
        deadline = time.monotonic() + grace_s
        while len(self._results) < len(self._refs) and time.monotonic() < deadline:
            self.wait(timeout_s=0.2)

    def kill(self, *, succeeded: bool = False) -> None:
        """Ends every worker; leased warm actors go back to the pool (reused only after a
        clean success, see orchestrator/runtime/pool.py), the others are killed."""
        pooled = {a for actors in self._pooled.values() for a in actors}
        for w in self._actors or list(self.workers.values()):
            if w in pooled:
                continue
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(w, no_restart=True)
        if self._pooled:
            from orchestrator.runtime.pool import find_pool

            pool = find_pool()
            for node, actors in self._pooled.items():
                if pool is not None:
                    # Waited for: the controller may be killed right after this attempt ends.
                    with contextlib.suppress(RayError, GetTimeoutError):
                        ray.get(pool.give_back.remote(node, actors, succeeded), timeout=30)
                else:
                    for a in actors:
                        with contextlib.suppress(Exception):
                            ray.kill(a, no_restart=True)
            self._pooled = {}

    def diagnostics(self, *, request: dict[str, Any], timeout_s: float) -> dict[int, Any]:
        refs = {r: w.diagnostics.remote(request) for r, w in self.workers.items()
                if r not in self._dead}
        out: dict[int, Any] = {}
        for r, ref in refs.items():
            try:
                out[r] = ray.get(ref, timeout=timeout_s)
            except (RayError, GetTimeoutError) as exc:
                out[r] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        return out
