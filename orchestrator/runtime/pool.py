"""Warm pool: pre-started worker actors (torch and the workers core already imported),
reused across jobs so a job skips process start and imports.

Scope: every node with CPUs, GPU nodes included, for built-in and user-code jobs (a pooled
actor also keeps a prestarted rank process for script / function jobs, workers/host/rankproc.py
`PrestartedRank`); jobs whose code is an uploaded package start cold (Ray unpacks the package
for the actors it creates with it). A pooled actor holds no Ray resources while idle
(num_cpus=0, num_gpus=0, pinned to its node); while it runs a job, the job's placement-group
bundle on that node holds the CPUs and GPUs, so gang accounting is unchanged.

GPUs: an idle pooled actor has imported torch but made no CUDA call, so it holds no GPU
memory and no device is fixed yet. For a GPU bundle the gang asks Ray which GPU the bundle
has (a zero-CPU task in it, runtime/gang.py) and the actor sets CUDA_VISIBLE_DEVICES to it
before the job runs, as Ray does for a cold actor; the rank layout is computed from the same
(node, GPU) pairs either way. An actor whose job created a CUDA context is not pooled again.

Isolation between jobs (tests/integration/runtime/test_warm_pool.py):
  * an actor runs one job at a time: a lease takes it out of the pool;
  * it comes back only after a clean completion; a failed, cancelled or killed job's actors
    are killed and replaced;
  * a lease names its lessee (the attempt's controller, a named actor): when the lessee is
    gone (its name found by no lookup for 10 s) without handing its actors back (killed by
    a forced cancel or the orphan sweep, or lost with its node), the filler kills them and
    the node is refilled;
  * before it is pooled again the actor restores its environment variables, working dir,
    stdout/stderr descriptors and torch thread count, destroys any process group, and drops
    every module the job imported under a new top-level package (user model code); an actor
    left with extra non-daemon threads is retired instead of reused;
  * run dirs, logs and checkpoints are per job (paths come from the assignment).

Lifecycle: `ensure_pool(size, prestart=)` gets or creates the detached pool and sets its size (the
leading control plane's setting wins over a pool left by an earlier start; a standby leaves the
pool alone until it takes over); a filler thread tops every node up to `size` and refills after
each lease; `drain()` (the leader's shutdown) kills the idle actors and stops refilling.
Leased actors stay with their jobs (controllers outlive the control plane) and are killed
when handed back to a draining pool.
The pool owns its actors, so the pool actor itself is never killed while jobs hold some.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.isolation.modes import JobConfinement
from orchestrator.runtime.events import NAMESPACE, POOL_NAME

log = logging.getLogger("meshyard.pool")


class WorkerPool:
    """Per node, `size` warm worker actors. Methods are quick; filling runs in a thread."""

    def __init__(self, size: int, prestart: bool = True,
                 confinement: JobConfinement | None = None, fork: bool = True) -> None:
        self.size = size
        self.fork = fork  # actors forked by the node's fork server (workers/host/forkserver.py)
        self.prestart = prestart  # pooled actors keep a prestarted rank process (user code)
        # What the jobs' ranks are confined to: a prestarted rank process holds the TCP
        # layer it needs before its job comes (workers/host/actor.py).
        self.confinement = confinement
        self.draining = False
        self._lock = threading.Lock()
        self._idle: dict[str, list[Any]] = {}
        self._rss: dict[Any, int] = {}  # idle actor -> resident bytes when it was warmed
        self._leases: dict[Any, tuple[str, str | None]] = {}  # leased actor -> (node, lessee)
        self._leases_checked = 0.0
        self._lessee_missing: dict[str, float] = {}  # lessee -> when a lookup first missed
        self._retired: list[str] = []  # why the last leased actors were not pooled again
        self._starting: dict[str, int] = {}
        self._filler = threading.Thread(target=self._fill_loop, daemon=True)
        self._filler.start()

    def _nodes(self) -> list[str]:
        return [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")]

    def _out(self, node: str) -> int:
        return sum(1 for n, _ in self._leases.values() if n == node)

    def _fill_loop(self) -> None:
        while True:
            try:
                if time.monotonic() - self._leases_checked > _LEASE_CHECK_S:
                    self._reclaim_abandoned()
                if not self.draining and self.size > 0:
                    for node in self._nodes():
                        self._top_up(node)
            except Exception:  # noqa: BLE001 - keep filling on a transient Ray error
                pass
            time.sleep(1.0)

    def _top_up(self, node: str) -> None:
        from workers.host.actor import WorkerActor
        from workers.host.forkserver import runtime_env

        with self._lock:
            have = len(self._idle.get(node, [])) + self._out(node) + \
                self._starting.get(node, 0)
            need = self.size - have
            if need <= 0:
                return
            self._starting[node] = self._starting.get(node, 0) + need
        actors = [WorkerActor.options(  # type: ignore[attr-defined]
            num_cpus=0, max_restarts=0,
            runtime_env=runtime_env(fork=self.fork, rank=self.prestart),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for _ in range(need)]
        ready = []
        for a in actors:
            try:
                warmed = ray.get(a.warm.remote(prestart=self.prestart,
                                               confinement=self.confinement),
                                 timeout=300)  # a loaded node is slow
                self._rss[a] = int(warmed["rss_bytes"])
                ready.append(a)
            except Exception:  # noqa: BLE001 - a worker that cannot start is dropped
                ray.kill(a, no_restart=True)
        with self._lock:
            self._starting[node] -= need
            if self.draining:
                self._kill(ready)
                return
            # The size may have shrunk (configure) while these warmed: keep what fits.
            idle = self._idle.setdefault(node, [])
            room = max(0, self.size - len(idle) - self._out(node))
            idle.extend(ready[:room])
            self._kill(ready[room:])

    # -- leases ---------------------------------------------------------------------------
    def lease(self, node_id: str, n: int, lessee: str | None = None) -> list[Any]:
        """Up to n warm actors on node_id (fewer, or none, when the pool is short).
        `lessee`: the name of the named actor (in the meshyard namespace) they work for; once
        no actor has that name any more, actors it did not hand back are killed."""
        with self._lock:
            idle = self._idle.get(node_id, [])
            got, self._idle[node_id] = idle[:n], idle[n:]
            for a in got:
                self._rss.pop(a, None)
                self._leases[a] = (node_id, lessee)
        return got

    def _reclaim_abandoned(self) -> int:
        """Kills the leased actors whose lessee is gone; returns how many."""
        self._leases_checked = time.monotonic()
        with self._lock:
            lessees = {who for _, who in self._leases.values() if who is not None}
        now, gone = time.monotonic(), set()
        for who in lessees:
            try:
                ray.get_actor(who, namespace=NAMESPACE)
                self._lessee_missing.pop(who, None)
            except ValueError:  # no live actor of that name, or a lookup that missed
                first = self._lessee_missing.setdefault(who, now)
                if now - first >= _LESSEE_GONE_S:  # a miss that lasts: gone
                    gone.add(who)
        for who in set(self._lessee_missing) - lessees:
            del self._lessee_missing[who]
        if not gone:
            return 0
        with self._lock:
            abandoned = [a for a, (_, who) in self._leases.items() if who in gone]
            for a in abandoned:
                del self._leases[a]
            self._kill(abandoned)
            self._note_retired(len(abandoned), f"its lessee ({', '.join(sorted(gone))}) is gone")
        return len(abandoned)

    def _note_retired(self, n: int, why: str) -> None:
        if n:
            self._retired = [*self._retired, f"{n} x {why}"][-_RETIRED_KEPT:]

    def give_back(self, node_id: str, actors: list[Any], clean: bool) -> int:
        """Returns leased actors; only clean ones that pass their own check are pooled again."""
        kept = 0
        for a in actors:
            ok, rss, why = False, 0, "its job did not succeed"
            if clean and a in self._leases:
                try:
                    check = ray.get(a.check_clean.remote(prestart=self.prestart),
                                    timeout=30)
                    ok, rss = bool(check["clean"]), int(check.get("rss_bytes", 0))
                    why = "not clean: " + "; ".join(check.get("reasons") or [])
                except Exception as exc:  # noqa: BLE001 - unreachable means unusable
                    why = f"its check failed: {type(exc).__name__}"
            elif clean:
                why = "its lease was reclaimed"
            with self._lock:
                self._leases.pop(a, None)
                if ok and not self.draining and len(self._idle.get(node_id, [])) < self.size:
                    self._idle.setdefault(node_id, []).append(a)
                    self._rss[a] = rss
                    kept += 1
                    continue
                self._note_retired(1, why if not ok else "the pool is full or draining")
            ray.kill(a, no_restart=True)
        return kept

    def configure(self, size: int, prestart: bool = True,
                  confinement: JobConfinement | None = None, fork: bool = True) -> None:
        """Sets the size per node and fills again (after a drain, or with a new size);
        `prestart`, `confinement` and `fork` apply to actors started from now on."""
        with self._lock:
            self.size, self.prestart, self.draining = size, prestart, False
            self.fork = fork
            self.confinement = confinement
            surplus = {node: idle[size:] for node, idle in self._idle.items()}
            for node, extra in surplus.items():
                self._idle[node] = self._idle[node][:size]
                self._kill(extra)

    def drain(self) -> int:
        """Stops refilling and kills every idle actor; returns how many were killed."""
        with self._lock:
            self.draining = True
            idle = [a for actors in self._idle.values() for a in actors]
            self._idle = {}
            self._kill(idle)
        return len(idle)

    def _kill(self, actors: list[Any]) -> None:
        for a in actors:
            self._rss.pop(a, None)
            with contextlib.suppress(Exception):  # already gone is fine
                ray.kill(a, no_restart=True)

    def status(self) -> dict[str, Any]:
        """Size, draining, and per node: idle, leased, starting actors and the
        resident memory the idle ones hold (measured when each was warmed or handed back);
        `retired`: why the last leased actors handed back were killed, not pooled again."""
        nodes = self._nodes()
        with self._lock:
            per = {node: {"idle": len(self._idle.get(node, [])),
                          "leased": self._out(node),
                          "starting": self._starting.get(node, 0),
                          "idle_rss_bytes": sum(self._rss.get(a, 0)
                                                for a in self._idle.get(node, []))}
                   for node in nodes}
        return {"size": self.size, "draining": self.draining, "nodes": per,
                "retired": list(self._retired)}

    def ready(self) -> dict[str, int]:
        """Idle warm actors per node (0 for a node still filling)."""
        nodes = self._nodes()
        with self._lock:
            return {node: len(self._idle.get(node, [])) for node in nodes}


_LEASE_CHECK_S = 2.0  # how often the filler looks for leases whose lessee is gone
_LESSEE_GONE_S = 10.0  # a lessee whose name lookups missed this long is gone (one can miss)
_RETIRED_KEPT = 20


RemotePool: Any = ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_concurrency=8, max_restarts=0)(WorkerPool)


def ensure_pool(size: int, *, prestart: bool = True,
                confinement: JobConfinement | None = None, near_node_id: str | None = None,
                fork: bool = True, timeout_s: float = 180.0) -> Any:
    """Gets or creates the detached pool (it outlives control-plane restarts) at `size`;
    `prestart`: its actors keep a prestarted rank process for user-code jobs, confined as
    `confinement` says when a job comes. A new pool goes on `near_node_id` (the control
    plane's node, as the controllers do). A pool whose node died (a worker host that was lost
    while Ray still listed its actor) is replaced by a new one."""
    from ray.exceptions import GetTimeoutError, RayActorError

    opts: dict[str, Any] = {"name": POOL_NAME, "namespace": NAMESPACE, "lifetime": "detached",
                            "get_if_exists": True}
    if near_node_id:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(near_node_id, soft=False)
    deadline = time.monotonic() + timeout_s
    while True:
        pool = RemotePool.options(**opts).remote(size, prestart, confinement, fork)
        try:
            ray.get(pool.configure.remote(size, prestart, confinement, fork),
                    timeout=max(1.0, min(60.0, deadline - time.monotonic())))
            return pool
        except (RayActorError, GetTimeoutError) as exc:
            if time.monotonic() >= deadline:
                raise
            if isinstance(exc, RayActorError):
                log.warning("the warm pool's actor is gone (its node died); starting another")
                with contextlib.suppress(Exception):
                    ray.kill(pool, no_restart=True)
            else:  # its node may be on its way to being declared dead: asked again
                log.warning("the warm pool did not answer; asking again")
            time.sleep(1.0)


def find_pool() -> Any | None:
    try:
        return ray.get_actor(POOL_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def drain_pool() -> None:
    """Kills the pool's idle actors and stops its refilling (leased ones finish their jobs
    first)."""
    pool = find_pool()
    if pool is None:
        return
    try:
        ray.get(pool.drain.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - a pool that cannot answer is gone or going
        log.warning("warm pool did not drain", exc_info=True)


class PoolView:
    """The warm pool's size and per-node idle / leased actors and idle memory (see
    WorkerPool.status), cached for the dashboard and /metrics; None when there is none."""

    def __init__(self) -> None:
        self._cache: tuple[float, dict[str, Any] | None] = (0.0, None)

    def status(self, *, max_age_s: float = 2.0) -> dict[str, Any] | None:
        at, cached = self._cache
        if time.monotonic() - at < max_age_s:
            return cached
        status = None
        if ray.is_initialized():
            pool = find_pool()
            try:
                status = ray.get(pool.status.remote(), timeout=5) if pool is not None else None
            except Exception:  # noqa: BLE001 - the page and /metrics show no pool then
                status = None
        self._cache = (time.monotonic(), status)
        return status


def wait_for_pool(size: int, *, timeout_s: float = 120.0) -> dict[str, int]:
    """Blocks until the warm pool holds `size` ready actors on every CPU node."""
    deadline = time.monotonic() + timeout_s
    ready: dict[str, int] = {}
    while time.monotonic() < deadline:
        pool = find_pool()
        ready = ray.get(pool.ready.remote(), timeout=10) if pool is not None else {}
        if ready and min(ready.values()) >= size:
            return ready
        time.sleep(0.2)
    raise TimeoutError(f"warm pool not ready after {timeout_s:g} s: {ready}")
