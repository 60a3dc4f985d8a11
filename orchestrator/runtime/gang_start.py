"""Starting one attempt's worker gang: warm actors leased from the pool where it has them,
cold actors created on the placement-group bundles (with the job's uploaded code as their
working dir), each pooled GPU bundle's GPU ids, ranks assigned from where the actors really
landed (`placement.ranks.landed_ranks`), rank 0's address and ports, the pre-flight check's
expected links, and each rank's typed `RankAssignment`. `release` ends what it started.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.mesh import MeshShape
from orchestrator.placement.links import LinkModel
from orchestrator.placement.ranks import landed_ranks
from orchestrator.preflight.verdict import ExpectedLink, Site, expected_links
from orchestrator.runtime.checkpoint_storage import host_local_checkpoints
from orchestrator.runtime.events import AttemptConfig, Master, RankStatus
from orchestrator.runtime.pool import find_pool
from orchestrator.spec import SpecKind
from workers.host.actor import WorkerActor
from workers.host.assignment import DistEnv, RankAssignment
from workers.host.forkserver import runtime_env

CALL_TIMEOUT_S = 5.0


@ray.remote(num_cpus=0, max_retries=0)
def _bundle_gpus() -> list[int]:
    """The GPU ids Ray assigns inside a bundle (run there with the bundle's num_gpus): the
    ones a cold actor in that bundle would see."""
    return [int(g) for g in ray.get_gpu_ids()]


class GangStart:
    def __init__(self, cfg: AttemptConfig, *, cancel: Any) -> None:
        self.cfg = cfg
        self._cancel = cancel
        self.workers: dict[int, Any] = {}  # rank -> its worker actor
        self.ranks: dict[int, RankStatus] = {}
        self.master = Master(addr="", port=0)
        self.preflight_port: int | None = None
        self._actors: list[Any] = []
        self._pooled: dict[str, list[Any]] = {}  # node id -> leased warm actors
        self._visible: dict[int, tuple[int, ...]] = {}  # pooled GPU bundle -> its GPU ids
        self._bundle_of: dict[int, int] = {}  # rank -> bundle index
        self._pooled_bundles: set[int] = set()

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
            self.release()
            return None
        gpu_bundles = [i for i in sorted(pooled) if self.cfg.bundles[i].gpu is not None]
        self._visible = dict(zip(gpu_bundles, map(tuple, bundle_gpus), strict=True))
        self._pooled_bundles = set(pooled)
        # Uploaded user code reaches each node through Ray's working_dir (unpacked there by
        # Ray's runtime-env agent, held while the actor lives); see usercode/packages.py.
        extra: dict[str, Any] = {}
        if self.cfg.package_uri:
            extra["working_dir"] = self.cfg.package_uri
        # a user-code rank's actor gets its rank process forked with it (torch imported)
        env = runtime_env(extra, fork=self.cfg.fork_workers,
                          rank=self.cfg.spec.kind is SpecKind.USER_CODE)
        actors = []
        for i, b in enumerate(self.cfg.bundles):
            if i in pooled:
                actors.append(pooled[i])
                continue
            actors.append(WorkerActor.options(  # type: ignore[attr-defined]
                num_cpus=b.cpus, num_gpus=1 if b.gpu is not None else 0, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=i), runtime_env=env,
            ).remote())
        self._actors = actors
        infos = self._gather([a.info.remote() for a in actors], self.cfg.init_timeout_s)
        if infos is None:
            self.release()
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
        port = ray.get(self.workers[0].free_port.remote(), timeout=CALL_TIMEOUT_S * 6)
        self.master = Master(addr=str(self.ranks[0].ip), port=int(port))
        self.preflight_port = self._preflight_port(used=int(port))
        return tuple(self.ranks[r] for r in sorted(self.ranks))

    def _preflight_port(self, *, used: int) -> int | None:
        """User code: a second port on rank 0's node for the pre-flight check's rendezvous
        (the user's code rendezvouses on MASTER_PORT after it)."""
        spec = self.cfg.spec
        if spec.kind is not SpecKind.USER_CODE or not spec.preflight.enabled or len(self.ranks) < 2:
            return None
        for _ in range(5):
            port = int(ray.get(self.workers[0].free_port.remote(), timeout=CALL_TIMEOUT_S * 6))
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
                              timeout=CALL_TIMEOUT_S)
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

    def assignments(self) -> dict[int, RankAssignment]:
        """Each rank's assignment, from where the ranks landed and the attempt's config."""
        cfg = self.cfg
        world = len(self.ranks)
        # Nodes in the order of their lowest rank (rank 0's node is node 0), ranks in order.
        per_node: dict[str | None, list[int]] = {}
        for r in sorted(self.ranks):
            per_node.setdefault(self.ranks[r].node_id, []).append(r)
        node_rank = {node: i for i, node in enumerate(per_node)}
        env = {"MESHYARD_JOB_ID": cfg.job_id, "MESHYARD_ATTEMPT": str(cfg.attempt)}
        out: dict[int, RankAssignment] = {}
        links = self.preflight_links()
        refused = host_local_checkpoints(
            enabled=True, shared=cfg.checkpoint_dir is not None or cfg.object_storage is not None,
            root=cfg.checkpoint_root,
            ips={r: s.ip for r, s in self.ranks.items()}, user_code=True) \
            if cfg.spec.kind is SpecKind.USER_CODE else None
        for r in self.workers:
            node = self.ranks[r].node_id
            peers = per_node[node]
            gpus = tuple(g for p in peers if (g := self.ranks[p].gpu) is not None)
            out[r] = RankAssignment(
                job_id=cfg.job_id, attempt=cfg.attempt, rank=r, spec=cfg.spec,
                run_dir=cfg.run_dir, log_dir=cfg.log_dir, env=env, node_rank=node_rank[node],
                num_nodes=len(per_node),
                local_gpus=gpus if len(gpus) == len(peers) else (),
                preflight_links=links.get(r, {}), preflight_port=self.preflight_port,
                visible_gpus=self._visible.get(self._bundle_of[r]),
                confinement=cfg.confinement, checkpoint_dir=cfg.checkpoint_dir,
                checkpoints_refused=refused,
                checkpoint_store=cfg.object_storage.uri if cfg.object_storage else None,
                package_uri=cfg.package_uri if self._bundle_of[r] in self._pooled_bundles
                else None,
                dist=DistEnv(rank=r, local_rank=peers.index(r), world_size=world,
                              local_world_size=len(peers), master_addr=self.master.addr,
                              master_port=self.master.port))
        return out

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

    def release(self, *, succeeded: bool = False) -> None:
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
