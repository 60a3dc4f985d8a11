"""One attempt's worker gang, driven by the controller (orchestrator/runtime/controller.py).

`WorkerGang` creates the worker actors on the placement-group bundles, assigns ranks from
where they really landed (`placement.ranks.landed_ranks`), hands each its typed
`RankAssignment`, and turns polls / results / actor deaths into typed values for the
controller: `RankStatus` updates, `RankFailure`s, a `Drained` batch per tick.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from orchestrator.lifecycle import RankState
from orchestrator.mesh import MeshShape
from orchestrator.placement.links import LinkModel
from orchestrator.placement.ranks import landed_ranks
from orchestrator.preflight import ExpectedLink, Site, expected_links
from orchestrator.runtime.events import AttemptConfig, Master, RankStatus
from orchestrator.runtime.failures import RankFailure
from orchestrator.runtime.pool import find_pool
from workers.actor import WorkerActor
from workers.assignment import (
    DistEnv,
    RankAssignment,
    RankResult,
    WorkerPoll,
    WorkerState,
    rank_log_path,
)
from workers.logcapture import unseen_tail

_POLL_TIMEOUT_S = 5.0
_ANCHOR_LINES = 3
_CAPTURED = ("stdout", "stderr")
# Reads a dead rank's log files on its node (they are where its process wrote them).
_unseen_tail = ray.remote(num_cpus=0, max_retries=0)(unseen_tail)


@ray.remote(num_cpus=0, max_retries=0)
def _bundle_gpus() -> list[int]:
    """The GPU ids Ray assigns inside a bundle (run there with the bundle's num_gpus): the
    ones a cold actor in that bundle would see."""
    return [int(g) for g in ray.get_gpu_ids()]


@dataclass(frozen=True)
class Drained:
    """One tick's poll of every live worker: metrics rows, log lines, per-rank updates
    (RankStatus fields: state, step, start_step, phase, last_heartbeat, pid), utilisation
    samples (at most one per rank per `usage_interval_s`), rank 0's completed checkpoints, and
    per rank of a user-code job the count of collectives its probe last saw enqueued (its
    progress when it reports no step)."""

    metrics: tuple[dict[str, Any], ...] = ()
    logs: tuple[dict[str, Any], ...] = ()
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: tuple[dict[str, Any], ...] = ()
    checkpoints: tuple[dict[str, Any], ...] = ()
    collectives: dict[int, int] = field(default_factory=dict)


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
        self.ranks: dict[int, RankStatus] = {}
        self.master = Master(addr="", port=0)
        self.preflight_port: int | None = None
        self._refs: dict[Any, int] = {}
        self._results: dict[int, RankResult] = {}
        self._dead: set[int] = set()
        self._last_step: dict[int, int] = {}
        self._beating: dict[int, int] = {}  # rank -> pid its worker's heartbeat names
        self._last_lines: dict[tuple[int, str], list[str]] = {}  # (rank, stream) -> anchor
        self._untailed: set[int] = set()  # dead ranks whose last output is not read yet
        self._usage_at: dict[int, float] = {}  # rank -> time of its last kept sample
        # At most ~5 utilisation rows per second for the whole job, whatever its size.
        self._usage_every_s = max(cfg.usage_interval_s, cfg.world_size / 5.0)
        self._actors: list[Any] = []
        self._pooled: dict[str, list[Any]] = {}  # node id -> leased warm actors
        self._visible: dict[int, tuple[int, ...]] = {}  # pooled GPU bundle -> its GPU ids
        self._bundle_of: dict[int, int] = {}  # rank -> bundle index
        self._pooled_bundles: set[int] = set()

    # -- start ------------------------------------------------------------------------------
    def create(self) -> tuple[RankStatus, ...] | None:
        """Creates the actors, reads where each landed and assigns ranks; None if cancelled."""
        pg = ray.util.get_placement_group(self.cfg.pg_name)
        pooled = self._lease_pooled()
        # A pooled actor holds no Ray GPU: its bundle's GPUs, as Ray assigns them there.
        bundle_gpus = self._gather([_bundle_gpus.options(  # type: ignore[attr-defined]
            num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i)).remote()
            for i in sorted(pooled) if self.cfg.bundles[i].gpu is not None],
            self.cfg.init_timeout_s)
        if bundle_gpus is None:
            self.kill()
            return None
        gpu_bundles = [i for i in sorted(pooled) if self.cfg.bundles[i].gpu is not None]
        self._visible = dict(zip(gpu_bundles, map(tuple, bundle_gpus), strict=True))
        self._pooled_bundles = set(pooled)
        # Uploaded user code reaches each node through Ray's working_dir (unpacked there by
        # Ray's runtime-env agent, held while the actor lives); see orchestrator/packages.py.
        extra: dict[str, Any] = {}
        if self.cfg.package_uri:
            extra["runtime_env"] = {"working_dir": self.cfg.package_uri}
        actors = []
        for i, b in enumerate(self.cfg.bundles):
            if i in pooled:
                actors.append(pooled[i])
                continue
            actors.append(WorkerActor.options(  # type: ignore[attr-defined]
                num_cpus=b.cpus, num_gpus=1 if b.gpu is not None else 0, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=i), **extra,
            ).remote())
        self._actors = actors
        infos = self._gather([a.info.remote() for a in actors], self.cfg.init_timeout_s)
        if infos is None:
            self.kill()
            return None
        gpu_ids = [self._visible.get(i) or x["gpu_ids"] for i, x in enumerate(infos)]
        where = [(str(x["node_id"]), g[0] if g else None) for x, g in zip(infos, gpu_ids,
                                                                         strict=True)]
        mesh = MeshShape.from_parallelism(self.cfg.spec.parallelism)
        ranks = landed_ranks(bundles=self.cfg.bundles, landed=where, mesh=mesh,
                             cluster=self.cfg.cluster, tp_within=self.cfg.spec.placement.tp_within)
        for i, rank in enumerate(ranks):
            info, (node_id, gpu) = infos[i], where[i]
            self.workers[rank] = actors[i]
            self._bundle_of[rank] = i
            self.ranks[rank] = RankStatus(rank=rank, node=self.cfg.bundles[i].node,
                                          node_id=node_id, gpu=gpu, coords=mesh.coords(rank),
                                          pid=info["pid"], ip=info["ip"], bundle=i)
        port = ray.get(self.workers[0].free_port.remote(), timeout=_POLL_TIMEOUT_S * 6)
        self.master = Master(addr=str(self.ranks[0].ip), port=int(port))
        self.preflight_port = self._preflight_port(used=int(port))
        return tuple(self.ranks[r] for r in sorted(self.ranks))

    def _preflight_port(self, *, used: int) -> int | None:
        """User code: a second port on rank 0's node for the pre-flight check's rendezvous
        (the user's code rendezvouses on MASTER_PORT after it)."""
        spec = self.cfg.spec
        if spec.entrypoint is None or not spec.preflight.enabled or len(self.ranks) < 2:
            return None
        for _ in range(5):
            port = int(ray.get(self.workers[0].free_port.remote(), timeout=_POLL_TIMEOUT_S * 6))
            if port != used:
                return port
        raise RuntimeError(f"no second free port on rank 0's node (got {used} again)")

    def _lease_pooled(self) -> dict[int, Any]:
        """Bundle index -> a warm pooled actor on the bundle's node."""
        if not self.cfg.use_pool:
            return {}
        pool = find_pool()
        if pool is None:
            return {}
        by_node: dict[str, list[int]] = {}
        for i, b in enumerate(self.cfg.bundles):
            by_node.setdefault(str(b.node_id), []).append(i)
        # The controller's name: the pool kills what it leased if the controller is gone
        # without handing the actors back.
        lessee = ray.get_runtime_context().get_actor_name() or None
        out: dict[int, Any] = {}
        for node, idxs in by_node.items():
            try:
                got = ray.get(pool.lease.remote(node, len(idxs), lessee),
                              timeout=_POLL_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                continue
            self._pooled.setdefault(node, []).extend(got)
            out.update(zip(idxs, got, strict=False))
        return out

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
        cfg = self.cfg
        world = len(self.ranks)
        # Nodes in the order of their lowest rank (rank 0's node is node 0), ranks in order.
        per_node: dict[str | None, list[int]] = {}
        for r in sorted(self.ranks):
            per_node.setdefault(self.ranks[r].node_id, []).append(r)
        node_rank = {node: i for i, node in enumerate(per_node)}
        env = dict(cfg.extra_env, MESHYARD_JOB_ID=cfg.job_id, MESHYARD_ATTEMPT=str(cfg.attempt))
        links = self.preflight_links()
        for r, w in self.workers.items():
            node = self.ranks[r].node_id
            peers = per_node[node]
            gpus = tuple(g for p in peers if (g := self.ranks[p].gpu) is not None)
            assignment = RankAssignment(
                job_id=cfg.job_id, attempt=cfg.attempt, rank=r, spec=cfg.spec,
                run_dir=cfg.run_dir, log_dir=cfg.log_dir, train_fn=cfg.train_fn,
                steps=cfg.steps, env=env, node_rank=node_rank[node], num_nodes=len(per_node),
                local_gpus=gpus if len(gpus) == len(peers) else (),
                preflight_links=links.get(r, {}), preflight_port=self.preflight_port,
                visible_gpus=self._visible.get(self._bundle_of[r]),
                package_uri=cfg.package_uri if self._bundle_of[r] in self._pooled_bundles
                else None,
                dist=DistEnv(rank=r, local_rank=peers.index(r), world_size=world,
                              local_world_size=len(peers), master_addr=self.master.addr,
                              master_port=self.master.port))
            self._refs[w.run.remote(assignment)] = r

    def preflight_links(self) -> dict[int, dict[str, dict[str, ExpectedLink]]]:
        """Each rank's expected pre-flight figures per backend, from where the ranks landed:
        gloo's host figures always, NCCL's links from the topology when every rank holds a
        GPU (calibrated figures when stored, else the defaults)."""
        if not self.cfg.spec.preflight.enabled or len(self.ranks) < 2:
            return {}
        sites = {r: Site(node=str(s.node or s.node_id), gpu=s.gpu, host=str(s.ip))
                 for r, s in self.ranks.items()}
        mesh = MeshShape.from_parallelism(self.cfg.spec.parallelism)
        figures = self.cfg.link_figures
        by_backend = {"gloo": expected_links(mesh=mesh, sites=sites, backend="gloo",
                                             figures=figures)}
        if self.cfg.cluster is not None and all(s.gpu is not None for s in sites.values()):
            by_backend["nccl"] = expected_links(
                mesh=mesh, sites=sites, backend="nccl",
                cluster_links=LinkModel(self.cfg.cluster, figures))
        return {r: {b: links[r] for b, links in by_backend.items()} for r in sites}

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
                result: RankResult = ray.get(ref)
            except RayActorError as exc:
                self._dead.add(rank)
                self._untailed.add(rank)
                result = RankResult(rank=rank, state=WorkerState.ERROR, error_type="WorkerDied",
                                    message=_death_message(exc))
            except RayError as exc:
                result = RankResult(rank=rank, state=WorkerState.ERROR,
                                    error_type=type(exc).__name__, message=str(exc))
            self._results[rank] = replace(result, time=result.time or time.time())
        return bool(done)

    def settle(self, *, timeout_s: float) -> None:
        """After a failure: waits (bounded) for the other ranks' ends that are on their way
        (a dead process surfaces a moment after the errors it causes)."""
        deadline = time.monotonic() + timeout_s
        while len(self._results) < len(self._refs) and time.monotonic() < deadline:
            self.wait(timeout_s=0.1)

    def drain(self) -> Drained:
        """Polls every live worker: metrics, log lines, heartbeats, per-rank updates."""
        live = {r: w for r, w in self.workers.items() if r not in self._dead}
        refs = {r: w.poll.remote() for r, w in live.items()}
        metrics: list[dict[str, Any]] = []
        logs: list[dict[str, Any]] = []
        ranks: dict[int, dict[str, Any]] = {}
        usage: list[dict[str, Any]] = []
        checkpoints: list[dict[str, Any]] = []
        collectives: dict[int, int] = {}
        for r, ref in refs.items():
            try:
                p: WorkerPoll = ray.get(ref, timeout=_POLL_TIMEOUT_S)
            except (RayActorError, GetTimeoutError, RayError):
                continue  # the run ref reports the death; a slow poll is retried next tick
            metrics.extend(p.metrics)
            logs.extend(p.logs)
            checkpoints.extend(p.checkpoints)
            if p.usage is not None and self._keep_usage(r, float(p.usage["at"])):
                usage.append(dict(p.usage, rank=r, node=self.ranks[r].node))
            upd: dict[str, Any] = {"state": RankState(p.state.upper())}
            if p.metrics:
                self._last_step[r] = int(p.metrics[-1].get("step", 0))
            hb = p.heartbeat
            if hb:
                self._beating[r] = int(hb.get("pid") or 0)
                if isinstance(hb.get("collective_count"), int):
                    collectives[r] = int(hb["collective_count"])
                upd.update(step=hb.get("step"), phase=hb.get("phase"),
                           last_heartbeat=hb.get("time"), pid=hb.get("pid"),
                           start_step=int(hb.get("start_step") or 0))
            elif r in self._last_step:
                upd["step"] = self._last_step[r]
            ranks[r] = upd
        for r, res in self._results.items():
            if res.failed:
                ranks.setdefault(r, {})["state"] = RankState.FAILED
        logs.extend(self._dead_ranks_output())
        self._remember_lines(logs)
        return Drained(metrics=tuple(metrics), logs=tuple(logs), ranks=ranks,
                       usage=tuple(usage), checkpoints=tuple(checkpoints),
                       collectives=collectives)

    def _keep_usage(self, rank: int, at: float) -> bool:
        if at - self._usage_at.get(rank, 0.0) < self._usage_every_s:
            return False
        self._usage_at[rank] = at
        return True

    def _remember_lines(self, logs: list[dict[str, Any]]) -> None:
        for line in logs:
            key = (int(line.get("rank", -1)), str(line.get("stream")))
            if key[1] in _CAPTURED:
                kept = self._last_lines.setdefault(key, [])
                kept.append(str(line.get("line", "")))
                del kept[:-_ANCHOR_LINES]

    def _dead_ranks_output(self) -> list[dict[str, Any]]:
        """What dead ranks wrote after their last forwarded line (lost with their process's
        buffers), read from their log files on their node."""
        out: list[dict[str, Any]] = []
        for r in sorted(self._untailed):
            self._untailed.discard(r)
            info, died = self.ranks[r], (self._results[r].time or time.time())
            for stream in _CAPTURED:
                path = str(rank_log_path(self.cfg.log_dir, r, stream))
                anchor = self._last_lines.get((r, stream), [])
                task = _unseen_tail.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                    str(info.node_id), soft=True)).remote(path, anchor)
                try:
                    lines = ray.get(task, timeout=_POLL_TIMEOUT_S * 2)
                except (RayError, GetTimeoutError):
                    continue
                out.extend({"rank": r, "stream": stream, "line": x, "time": died}
                           for x in lines)
        return out

    def last_steps(self) -> dict[int, int]:
        return dict(self._last_step)

    def finished(self) -> dict[int, RankResult]:
        """Ranks whose process ended with exit code 0 (their run completed)."""
        return {r: res for r, res in self._results.items() if not res.failed}

    def all_beating(self) -> bool:
        """Every rank has sent a heartbeat (user code: every rank's process runs)."""
        return bool(self.ranks) and set(self._beating) >= set(self.ranks)

    def pids(self) -> tuple[int, ...]:
        """Per rank, the pid its heartbeat names (user code: the rank process)."""
        return tuple(self._beating[r] for r in sorted(self._beating))

    def failures(self) -> list[RankFailure]:
        """Failed ranks, earliest first."""
        fs = [RankFailure(rank=r, error_type=res.error_type or "Error", message=res.message,
                          node=self.ranks[r].node, node_id=self.ranks[r].node_id,
                          traceback=res.traceback, time=res.time or 0.0,
                          setup_error=res.setup_error, exit_code=res.exit_code)
              for r, res in self._results.items() if res.failed]
        return sorted(fs, key=lambda f: (f.time, f.rank))

    def all_done(self) -> bool:
        return len(self._results) == len(self._refs) and not self.failures()

    def stop_all(self, *, grace_s: float) -> None:
        for r, w in self.workers.items():
            if r not in self._results:
                w.stop.remote()
        self.settle(timeout_s=grace_s)

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
