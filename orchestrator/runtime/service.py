"""The control plane's runtime: Ray connection, node registry, scheduler and poller threads.

`meshyard serve` builds it with `build_runtime(settings=, store=)` and the API's lifespan calls
`start()` / `stop()`. Embedded default: without `settings.ray_address` it starts a local Ray
bound to 127.0.0.1 (and stops it on exit); with one, it joins that cluster and leaves it up.

Start order: connect -> register nodes + topology (the declared file, else discovered on the
GPU nodes: orchestrator/runtime/nodes.py) -> reconcile (reattach to live controllers by name
-- the poller does that on its first pass -- and sweep orphans) -> scheduler and poller
threads. Stop order: threads, then Ray (only if this process started it). Controllers are
detached: they keep training while the control plane is down and are picked up again.

Warm pool (orchestrator/runtime/pool.py): `Runtime(warm_pool=N)`, or MESHYARD_WARM_POOL=N for
`meshyard serve`, keeps N pre-started worker actors per CPU-only node for CPU jobs.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ray

from orchestrator.placement.links import LinkFigures
from orchestrator.planner.calibration.figures import load_figures
from orchestrator.planner.calibration.figures import path_in as calibration_path
from orchestrator.runtime.events import NAMESPACE
from orchestrator.runtime.nodes import TopologySource, register_nodes
from orchestrator.runtime.poller import Poller, sweep_orphans
from orchestrator.runtime.pool import ensure_pool, find_pool
from orchestrator.runtime.scheduler import Scheduler
from orchestrator.settings import Settings
from orchestrator.store.leader import LeaderElector, LeaderLock, is_shared_database
from orchestrator.store.repo import Store

log = logging.getLogger("meshyard.runtime")
_SWEEP_EVERY_S = 30.0


def connect_ray(address: str | None) -> bool:
    """Connects this process to Ray; returns True when it started a local cluster.

    A local Ray binds 127.0.0.1 when RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was in the
    environment before ray was first imported (`meshyard serve` sets it for the embedded
    default; Ray reads it once)."""
    if ray.is_initialized():
        return False
    # ray.init replaces the SIGTERM handler with one that raises SystemExit wherever the main
    # thread is; the server (uvicorn) has its own graceful handler, so keep it.
    main = threading.current_thread() is threading.main_thread()
    saved = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if address:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                     logging_level=logging.WARNING)
            return False
        # address="local": start our own Ray; a bare init() joins any Ray already on the host.
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING,
                 _node_ip_address="127.0.0.1")
        return True
    finally:
        if main and saved is not None:
            signal.signal(signal.SIGTERM, saved)


class _Loop:
    """A daemon thread calling `fn` every `interval_s` until stopped; errors are logged."""

    def __init__(self, name: str, fn: Callable[[], Any], interval_s: float) -> None:
        self._fn, self._interval = fn, interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._fn()
            except Exception:  # noqa: BLE001 - a loop survives a bad pass
                log.exception("%s pass failed", self._thread.name)
            self._wake.wait(self._interval)
            self._wake.clear()


class Runtime:
    """`train_fn`, `extra_env` and `discovery` (topology discovery options) are hooks for
    tests and benchmarks; `meshyard serve` leaves them unset."""

    def __init__(self, settings: Settings, store: Store, *, tick_s: float = 0.25,
                 train_fn: str | None = None, extra_env: dict[str, str] | None = None,
                 warm_pool: int = 0, discovery: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.warm_pool = warm_pool  # warm worker actors per CPU node (runtime/pool.py)
        self.store = store
        self.tick_s = tick_s
        self.train_fn = train_fn
        self.extra_env = extra_env
        self.owns_ray = False
        self.topology = TopologySource(cluster_file=settings.cluster_file, discovery=discovery)
        self._loops: list[_Loop] = []
        self._last_sweep = 0.0
        self._launching: set[str] = set()  # shared by scheduler and poller (see Poller)
        self.scheduler: Scheduler | None = None
        self.poller = Poller(self.store, launching=self._launching)
        self.elector: LeaderElector | None = None
        self._elected = threading.Event()  # set by the elector; the poll loop reconciles

    def _link_figures(self) -> LinkFigures | None:
        """Calibrated link figures (`meshyard calibrate` writes them into the data dir)."""
        return _calibrated_figures(Path(self.settings.data_dir))

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.perf_counter()
        self.owns_ray = connect_ray(self.settings.ray_address)
        runs = Path(self.settings.runs_dir).resolve()
        runs.mkdir(parents=True, exist_ok=True)
        self.scheduler = Scheduler(store=self.store, runs_dir=runs, topology=self.topology.current,
                                   near_node_id=ray.get_runtime_context().get_node_id(),
                                   train_fn=self.train_fn, extra_env=self.extra_env,
                                   launching=self._launching, use_pool=self.warm_pool > 0,
                                   figures=self._link_figures,
                                   packages_dir=Path(self.settings.packages_dir).resolve())
        if self.warm_pool > 0:
            ensure_pool(self.warm_pool)
        # One active scheduler per database (orchestrator/store/leader.py): the lock holder
        # schedules and polls; a standby serves the API's reads and takes over when it dies.
        self.elector = self._make_elector()
        if self.elector is not None:
            self.elector.step()  # lead at once when nobody else does (the embedded default)
        if self.is_leader:
            self._reconcile()
        self._loops = [_Loop("meshyard-poller", self._poll_pass, self.tick_s),
                       _Loop("meshyard-scheduler", self._schedule_pass, self.tick_s)]
        for loop in self._loops:
            loop.start()
        if self.elector is not None:
            self.elector.start()
        log.info("runtime up in %.1f s (ray %s, %s)", time.perf_counter() - t0,
                 "started locally" if self.owns_ray else "joined",
                 "leader" if self.is_leader else "standby: serving reads")

    def stop(self) -> None:
        for loop in self._loops:
            loop.stop()
        self._loops = []
        if self.elector is not None:
            self.elector.stop()  # releases the lock: a standby takes over on its next retry
            self.elector = None
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False

    # -- leadership -----------------------------------------------------------------------
    def _make_elector(self) -> LeaderElector | None:
        url = self.store.engine.url.render_as_string(hide_password=False)
        if not is_shared_database(url):
            return None
        return LeaderElector(LeaderLock(self.store.engine, name="scheduler"),
                             on_elected=self._elected.set)

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def _reconcile(self) -> None:
        """On becoming leader: a fresh poller reattaches to live controllers by name and
        replays from the stored cursors; orphans are swept; nodes are registered."""
        self._elected.clear()
        self.poller = Poller(self.store, launching=self._launching)
        self.register_nodes()
        self.poller.tick()
        sweep_orphans(self.store, launching=self._launching)
        self._last_sweep = time.monotonic()

    def _schedule_pass(self) -> None:
        if self.scheduler is not None and self.is_leader and not self._elected.is_set():
            self.scheduler.tick()

    def _poll_pass(self) -> None:
        if not self.is_leader:
            return
        if self._elected.is_set():  # took over from another process: reconcile first
            self._reconcile()
            return
        self.poller.tick()
        if time.monotonic() - self._last_sweep > _SWEEP_EVERY_S:
            self._last_sweep = time.monotonic()
            sweep_orphans(self.store, launching=self._launching)
            self.register_nodes()

    # -- nodes ----------------------------------------------------------------------------
    def register_nodes(self) -> None:
        """Writes Ray's live nodes joined with their topology into the store (GET /v1/cluster)."""
        register_nodes(self.store, self.topology)

    def poke(self) -> None:
        """Runs the loops now (tests; a submit could call it to shave the tick)."""
        for loop in self._loops:
            loop.poke()

    def wait_for_pool(self, *, timeout_s: float = 120.0) -> dict[str, int]:
        """Blocks until the warm pool holds `warm_pool` ready actors on every CPU node."""
        deadline = time.monotonic() + timeout_s
        ready: dict[str, int] = {}
        while time.monotonic() < deadline:
            pool = find_pool()
            ready = ray.get(pool.ready.remote(), timeout=10) if pool is not None else {}
            if ready and min(ready.values()) >= self.warm_pool:
                return ready
            time.sleep(0.2)
        raise TimeoutError(f"warm pool not ready after {timeout_s:g} s: {ready}")


def _calibrated_figures(data_dir: Path) -> LinkFigures | None:
    try:
        return load_figures(data_dir)
    except (OSError, ValueError) as exc:  # a damaged calibration file must not stop placing
        log.warning("ignoring calibration %s: %s", calibration_path(data_dir), exc)
        return None


def build_runtime(*, settings: Settings, store: Store) -> Runtime:
    # MESHYARD_WARM_POOL (Settings.warm_pool): warm worker actors per CPU node, 0 = off.
    return Runtime(settings, store, warm_pool=settings.warm_pool)
