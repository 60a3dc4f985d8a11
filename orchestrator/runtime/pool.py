"""Warm pool: pre-started worker actors (torch and the workers core already imported),
reused across jobs so a job skips process start and imports.

Scope: CPU bundles (device cpu, or auto on a cluster without GPUs). A pooled actor holds no
Ray resources while idle (num_cpus=0, pinned to its node); while it runs a job, the job's
placement-group bundle on that node holds the CPUs, so gang accounting is unchanged. GPU
bundles always get fresh actors: Ray's per-actor CUDA_VISIBLE_DEVICES is the GPU isolation.

Isolation between jobs (tests/integration/runtime/test_warm_pool.py):
  * an actor runs one job at a time: a lease takes it out of the pool;
  * it comes back only after a clean completion; a failed, cancelled or killed job's actors
    are killed and replaced;
  * before it is pooled again the actor restores its environment variables, working dir,
    stdout/stderr descriptors and torch thread count, destroys any process group, and drops
    every module the job imported under a new top-level package (user model code); an actor
    left with extra non-daemon threads is retired instead of reused;
  * run dirs, logs and checkpoints are per job (paths come from the assignment).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.runtime.events import NAMESPACE, POOL_NAME


class WorkerPool:
    """Per node, `size` warm worker actors. Methods are quick; filling runs in a thread."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._idle: dict[str, list[Any]] = {}
        self._out: dict[str, int] = {}  # leased now, by node
        self._starting: dict[str, int] = {}
        self._filler = threading.Thread(target=self._fill_loop, daemon=True)
        self._filler.start()

    def _cpu_nodes(self) -> list[str]:
        return [n["NodeID"] for n in ray.nodes()
                if n.get("Alive") and n["Resources"].get("CPU") and not n["Resources"].get("GPU")]

    def _fill_loop(self) -> None:
        while True:
            try:
                for node in self._cpu_nodes():
                    self._top_up(node)
            except Exception:  # noqa: BLE001 - keep filling on a transient Ray error
                pass
            time.sleep(1.0)

    def _top_up(self, node: str) -> None:
        from workers.actor import WorkerActor

        with self._lock:
            have = len(self._idle.get(node, [])) + self._out.get(node, 0) + \
                self._starting.get(node, 0)
            need = self.size - have
            if need <= 0:
                return
            self._starting[node] = self._starting.get(node, 0) + need
        actors = [WorkerActor.options(  # type: ignore[attr-defined]
            num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for _ in range(need)]
        ready = []
        for a in actors:
            try:
                ray.get(a.warm.remote(), timeout=120)
                ready.append(a)
            except Exception:  # noqa: BLE001 - a worker that cannot start is dropped
                ray.kill(a, no_restart=True)
        with self._lock:
            self._starting[node] -= need
            self._idle.setdefault(node, []).extend(ready)

    # -- leases ---------------------------------------------------------------------------
    def lease(self, node_id: str, n: int) -> list[Any]:
        """Up to n warm actors on node_id (fewer, or none, when the pool is short)."""
        with self._lock:
            idle = self._idle.get(node_id, [])
            got, self._idle[node_id] = idle[:n], idle[n:]
            self._out[node_id] = self._out.get(node_id, 0) + len(got)
        return got

    def give_back(self, node_id: str, actors: list[Any], clean: bool) -> int:
        """Returns leased actors; only clean ones that pass their own check are pooled again."""
        kept = 0
        for a in actors:
            ok = False
            if clean:
                try:
                    ok = bool(ray.get(a.check_clean.remote(), timeout=10)["clean"])
                except Exception:  # noqa: BLE001 - unreachable means unusable
                    ok = False
            with self._lock:
                self._out[node_id] = max(0, self._out.get(node_id, 0) - 1)
                if ok and len(self._idle.get(node_id, [])) < self.size:
                    self._idle.setdefault(node_id, []).append(a)
                    kept += 1
                    continue
            ray.kill(a, no_restart=True)
        return kept

    def ready(self) -> dict[str, int]:
        """Idle warm actors per CPU-only node (0 for a node still filling)."""
        nodes = self._cpu_nodes()
        with self._lock:
            return {node: len(self._idle.get(node, [])) for node in nodes}


RemotePool: Any = ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_concurrency=8, max_restarts=0)(WorkerPool)


def ensure_pool(size: int) -> Any:
    """Gets or creates the detached pool (it outlives control-plane restarts)."""
    return RemotePool.options(name=POOL_NAME, namespace=NAMESPACE, lifetime="detached",
                              get_if_exists=True).remote(size)


def find_pool() -> Any | None:
    try:
        return ray.get_actor(POOL_NAME, namespace=NAMESPACE)
    except ValueError:
        return None
