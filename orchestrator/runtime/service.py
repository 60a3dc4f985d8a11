"""The control plane's runtime: Ray connection, node registry, scheduler and poller threads.

`meshyard serve` builds it with `build_runtime(settings=, store=)` and the API's lifespan calls
`start()` / `stop()`. Embedded default: without `settings.ray_address` it starts a local Ray
bound to 127.0.0.1 (and stops it on exit); with one, it joins that cluster and leaves it up.

Start order: connect -> register nodes + topology (the declared file, else discovered on the
GPU nodes: orchestrator/runtime/nodes.py) -> reconcile (reattach to live controllers by name
-- the poller does that on its first pass -- and sweep orphans) -> scheduler and poller
threads. Stop order: threads, then Ray (only if this process started it). Controllers are
detached: they keep training while the control plane is down and are picked up again.

Warm pool (orchestrator/runtime/pool.py), on by default: N pre-started worker actors per
node (GPU nodes included; built-in and user-code jobs), N = `Settings.resolved_warm_pool`
(MESHYARD_WARM_POOL; 2 on the embedded Ray, 1 per node on a Ray cluster) unless
`Runtime(warm_pool=N)` says otherwise (0: every job starts cold). Set up by the leader (at
start, and by a standby when it takes over), refilled after each job, drained when the leader
stops; a standby's start and stop leave it to the leader.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray._common.utils import get_default_ray_temp_dir

from meshyard._confine import self_test
from meshyard._landlock import abi as landlock_abi
from orchestrator.admission.quotas import Quota, effective_quota
from orchestrator.isolation.modes import (
    TRUSTED_WARNING,
    HostCheck,
    IsolationMode,
    JobConfinement,
    landlock_problem,
    refusal,
)
from orchestrator.isolation.worker_env import scrub
from orchestrator.placement.links import LinkFigures
from orchestrator.planner.calibration.figures import load_figures
from orchestrator.planner.calibration.figures import path_in as calibration_path
from orchestrator.runtime.events import NAMESPACE
from orchestrator.runtime.node_sampling import NodeSamplers
from orchestrator.runtime.nodes import TopologySource, nodes_changed, register_nodes
from orchestrator.runtime.poller import Poller, sweep_orphans
from orchestrator.runtime.pool import PoolView, drain_pool, ensure_pool, wait_for_pool
from orchestrator.runtime.sandbox import ConfinedStarter
from orchestrator.runtime.scheduler import Scheduler
from orchestrator.runtime.spares import SpareControllers
from orchestrator.settings import Settings
from orchestrator.store.leader import LeaderElector, LeaderLock, is_shared_database
from orchestrator.store.repo import Store
from workers.host import setup_worker

log = logging.getLogger("meshyard.runtime")
DEFAULT_WORKER_PORTS = (10002, 19999)  # Settings.ray_worker_ports' default
_SWEEP_EVERY_S = 30.0
_NODES_EVERY_S = 5.0  # a look at Ray's live nodes; they are registered again on a change


@dataclass(frozen=True)
class LocalRay:
    """How the embedded Ray is started: with an environment holding none of the control
    plane's secrets (orchestrator/isolation/worker_env.py), and — `confine` — out of the
    private data dir (Landlock, runtime/sandbox.py) except the directories jobs use.

    Isolated mode confines each rank process of user code instead (meshyard/_confine.py),
    which needs a mount namespace of its own: no process inside a Landlock domain may mount,
    so there the embedded Ray itself is started without the data-dir confinement (`confine`
    False), and the ranks it starts hide the data dir themselves."""

    private_dir: Path
    open_inside: tuple[Path, ...] = ()
    secrets: tuple[str, ...] = ()
    confine: bool = True
    worker_ports: tuple[int, int] | None = None  # Ray's worker processes' port range

    @classmethod
    def for_settings(cls, settings: Settings) -> LocalRay:
        policy = settings.policy()
        inside = [settings.resolved_runs_dir, *(Path(r) for r in policy.data_roots),
                  *(Path(r) for r in policy.working_dir_roots)]
        return cls(private_dir=Path(settings.data_dir),
                   open_inside=tuple(p.resolve() for p in inside),
                   secrets=tuple(s for s in (settings.admin_token, settings.database_url) if s),
                   confine=settings.confine_workers
                   and settings.isolation is IsolationMode.TRUSTED,
                   worker_ports=settings.worker_port_range)


@contextmanager
def _worker_port_range(ports: tuple[int, int] | None) -> Iterator[None]:
    """`ray.init` starts a local cluster with random worker ports and has no argument for
    the range (`ray start --min-worker-port` has); a job's ranks must be kept out of every
    Ray worker's port, so the range is given to the RayParams `ray.init` builds."""
    if ports is None:
        yield
        return
    from ray._private import parameter

    original = parameter.RayParams.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("min_worker_port"):
            kwargs.update(min_worker_port=ports[0], max_worker_port=ports[1])
        original(self, *args, **kwargs)

    parameter.RayParams.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original  # type: ignore[method-assign]


@contextmanager
def _scrubbed_environ(secrets: tuple[str, ...]) -> Iterator[None]:
    """os.environ without meshyard's secrets while Ray's processes are started (they copy
    the environment then); restored after, for this process's own later reads."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(scrub(saved, secrets=secrets))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def connect_ray(address: str | None, *, local: LocalRay | None = None
                ) -> bool | ConfinedStarter:
    """Connects this process to Ray; returns True (or, with `local`, the starter thread to
    close after `ray.shutdown()`) when it started a local cluster, False when it joined one.

    A local Ray binds 127.0.0.1 when RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was in the
    environment before ray was first imported (`meshyard serve` sets it for the embedded
    default; Ray reads it once). With `local`, the local Ray's processes — and so every job's
    code — start confined and without the secrets (see LocalRay)."""
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
        def start() -> None:
            init_local_ray(worker_ports=local.worker_ports if local is not None else None,
                           logging_level=logging.WARNING)

        if local is None:
            start()
            return True
        with _scrubbed_environ(local.secrets):
            if not local.confine:
                start()
                return True
            # Ray makes its temp dir after the confinement: a new entry beside the path to
            # the data dir (/tmp/ray for a data dir under /tmp) would get no rule, so it is
            # made, and opened, first.
            ray_tmp = Path(get_default_ray_temp_dir())
            ray_tmp.mkdir(parents=True, exist_ok=True)
            starter = ConfinedStarter(start, private=local.private_dir,
                                      open_inside=(*local.open_inside, ray_tmp)).start()
        how = starter.confinement
        (log.info if how.active else log.warning)("local Ray: %s", how.detail)
        return starter
    finally:
        if main and saved is not None:
            signal.signal(signal.SIGTERM, saved)


# Ray starts one idle worker process per CPU of the head when the first driver connects
# (each imports ray: about a CPU-second, and 100 MB, on a 128-core GPU host 128 of them).
# Meshyard's worker actors never run in one (they start under their own runtime_env, through
# the fork server), and the few plain actors it starts get a worker when they ask for one.
LOCAL_RAY_CONFIG = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


def init_local_ray(*, worker_ports: tuple[int, int] | None = DEFAULT_WORKER_PORTS,
                   **kwargs: Any) -> None:
    """`ray.init` of a new local cluster on 127.0.0.1 in meshyard's namespace, its worker
    processes on `worker_ports` (isolated mode refuses user code on a node without a worker
    port range) and started through meshyard's setup worker (workers/host/setup_worker.py);
    `kwargs` go to `ray.init` (num_cpus, ...)."""
    options: dict[str, Any] = dict(namespace=NAMESPACE, include_dashboard=False,
                                   log_to_driver=False, _node_ip_address="127.0.0.1",
                                   _system_config=LOCAL_RAY_CONFIG)
    options.update(kwargs)
    with _worker_port_range(worker_ports), setup_worker.installed():
        ray.init(address="local", **options)


class _Loop:
    """A daemon thread calling `fn` every `interval_s` until stopped (the first call after
    `start_after_s`); errors are logged. `pokeable`: Runtime.poke() runs it at once."""

    def __init__(self, name: str, fn: Callable[[], Any], interval_s: float, *,
                 start_after_s: float = 0.0, pokeable: bool = True) -> None:
        self._fn, self._interval, self._start_after = fn, interval_s, start_after_s
        self.pokeable = pokeable
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
        if self._start_after > 0:
            self._stop.wait(self._start_after)
        while not self._stop.is_set():
            try:
                self._fn()
            except Exception:  # noqa: BLE001 - a loop survives a bad pass
                log.exception("%s pass failed", self._thread.name)
            self._wake.wait(self._interval)
            self._wake.clear()


class Runtime:
    """`discovery` (topology discovery options) is a hook for tests and benchmarks;
    `meshyard serve` leaves it unset."""

    def __init__(self, settings: Settings, store: Store, *, tick_s: float = 0.25,
                 warm_pool: int | None = None,
                 discovery: Mapping[str, Any] | None = None,
                 api_port: int | None = None) -> None:
        self.settings = settings
        self.api_port = api_port if api_port is not None else settings.port
        # Warm worker actors per node (runtime/pool.py); None: the settings' default.
        self.warm_pool = settings.resolved_warm_pool if warm_pool is None else warm_pool
        self._pool_view = PoolView()
        self.store = store
        self.tick_s = tick_s
        self.owns_ray: bool | ConfinedStarter = False
        self.topology = TopologySource(cluster_file=settings.cluster_file, discovery=discovery)
        self._loops: list[_Loop] = []
        self._last_sweep = self._last_node_look = 0.0
        self._launching: set[str] = set()  # shared by scheduler and poller (see Poller)
        self.scheduler: Scheduler | None = None
        self.spares: SpareControllers | None = None
        self.samplers = NodeSamplers()  # the usage loop's, per node (runtime/usage.py)
        self.poller = Poller(self.store, launching=self._launching,
                             health_policy=settings.health_policy(),
                             runs_dir=Path(settings.resolved_runs_dir).resolve())
        self.elector: LeaderElector | None = None
        self._elected = threading.Event()  # set by the elector; the poll loop reconciles
        # Isolated mode: whether this host confines jobs (start() checks); None: trusted.
        self.isolation: HostCheck | None = None
        # What the warm pool's actors are confined to, and the node they start nearest to.
        self._pool_place: tuple[JobConfinement | None, str | None] = (None, None)

    def _quota_for(self, owner: str) -> Quota:
        """The owner's running limits: set for them, else the server's defaults (admins:
        unlimited unless set)."""
        user = self.store.get_user(owner)
        return effective_quota(self.store.get_quota(owner),
                               defaults=self.settings.quota_defaults(),
                               is_admin=user is not None and user.is_admin)

    def _link_figures(self) -> LinkFigures | None:
        """Calibrated link figures (`meshyard calibrate` writes them into the data dir)."""
        return _calibrated_figures(Path(self.settings.data_dir))

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.perf_counter()
        runs = Path(self.settings.resolved_runs_dir).resolve()
        runs.mkdir(parents=True, exist_ok=True)  # before Ray starts: it stays open to jobs
        storage = self.settings.checkpoint_storage
        if storage is not None and not Path(storage).is_dir():
            raise RuntimeError(f"the checkpoint storage {storage} is not a directory: mount it "
                               "at this path on every host (and here), or unset "
                               "MESHYARD_CHECKPOINT_STORAGE / --checkpoint-storage")
        object_storage = self.settings.object_storage()
        confinement = self._check_isolation()  # forks a test child: before Ray's threads
        if object_storage is not None:  # the store's client starts threads: after the fork
            object_storage.check()
        self.owns_ray = connect_ray(self.settings.ray_address,
                                    local=LocalRay.for_settings(self.settings))
        near = ray.get_runtime_context().get_node_id()
        if self.settings.spare_controllers > 0:
            self.spares = SpareControllers(self.settings.spare_controllers, near_node_id=near)
        self.scheduler = Scheduler(store=self.store, runs_dir=runs, topology=self.topology.current,
                                   near_node_id=near, spares=self.spares,
                                   launching=self._launching, use_pool=self.warm_pool > 0,
                                   fork_workers=self.settings.fork_workers,
                                   figures=self._link_figures, quota_for=self._quota_for,
                                   allow_fault_injection=self.settings.allow_fault_injection,
                                   packages_dir=Path(self.settings.packages_dir).resolve(),
                                   usage_interval_s=self.settings.usage_interval_s,
                                   health_policy=self.settings.health_policy(),
                                   confinement=confinement,
                                   preemption=self.settings.preemption,
                                   preempt_min_run_s=self.settings.preempt_min_run_s,
                                   checkpoint_storage=self.settings.checkpoint_storage,
                                   object_storage=object_storage)
        self._pool_place = (confinement, near)  # the leader sets the pool up (_reconcile)
        # One active scheduler per database (orchestrator/store/leader.py): the lock holder
        # schedules and polls; a standby serves the API's reads and takes over when it dies.
        self.elector = self._make_elector()
        if self.elector is not None:
            self.elector.step()  # lead at once when nobody else does (the embedded default)
        if self.is_leader:
            self._reconcile()
        self._loops = [_Loop("meshyard-poller", self._poll_pass, self.tick_s),
                       _Loop("meshyard-scheduler", self._schedule_pass, self.tick_s)]
        if self.settings.node_usage_interval_s > 0:
            every = self.settings.node_usage_interval_s
            self._loops.append(_Loop("meshyard-usage", self._usage_pass, every,
                                     start_after_s=every, pokeable=False))
        for loop in self._loops:
            loop.start()
        if self.elector is not None:
            self.elector.start()
        log.info("runtime up in %.1f s (ray %s, %s)", time.perf_counter() - t0,
                 "started locally" if self.owns_ray else "joined",
                 "leader" if self.is_leader else "standby: serving reads")

    def _check_isolation(self) -> JobConfinement | None:
        """Isolated mode: whether this host can confine a rank (a test child process tries,
        meshyard/_confine.py); the jobs' confinement when it can, None when it cannot (then
        only admins' code runs, unconfined) or in trusted mode."""
        if self.settings.isolation is IsolationMode.TRUSTED:
            self.isolation = None
            log.warning("%s", TRUSTED_WARNING)
            return None
        old = landlock_problem(landlock_abi())  # says which kernel it takes, plainly
        with tempfile.TemporaryDirectory(prefix="meshyard-confine-") as scratch:
            problems = [old] if old else self_test(scratch)
        self.isolation = HostCheck(landlock_abi=landlock_abi(), problems=tuple(problems))
        (log.info if self.isolation.ok else log.warning)("tenant isolation: %s",
                                                          self.isolation.describe())
        return self.settings.job_confinement(api_port=self.api_port) \
            if self.isolation.ok else None

    def code_refusal(self) -> str | None:
        """Why non-admin users' code is refused now (isolated mode on a host that cannot
        confine it); None when it is not."""
        if self.isolation is None or self.isolation.ok:
            return None
        return refusal(self.isolation)

    def stop(self) -> None:
        for loop in self._loops:
            loop.stop()
        self._loops = []
        if self.spares is not None and ray.is_initialized():
            self.spares.close()
        if ray.is_initialized():
            self.samplers.close()
        if self.warm_pool > 0 and ray.is_initialized() and self.is_leader:
            # A standby taking over fills it again (_reconcile).
            self._drain_pool()
        if self.elector is not None:
            self.elector.stop()  # releases the lock: a standby takes over on its next retry
            self.elector = None
        if self.owns_ray:
            ray.shutdown()
            if isinstance(self.owns_ray, ConfinedStarter):
                self.owns_ray.close()
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
        self._set_up_pool()
        self.poller = Poller(self.store, launching=self._launching,
                             health_policy=self.settings.health_policy(),
                             runs_dir=Path(self.settings.resolved_runs_dir).resolve())
        self.register_nodes()
        self.poller.tick()
        sweep_orphans(self.store, launching=self._launching, spares=self._spare_names())
        self._last_sweep = time.monotonic()

    def _set_up_pool(self) -> None:
        """The warm pool as this control plane's settings say: filled to `warm_pool` per
        node, or drained when it is 0 (a pool left by an earlier start with the pool on).
        Only the leader does this, at start and when it takes over: a standby's settings
        never resize, and its stop never drains, the pool the leader's jobs use."""
        confinement, near = self._pool_place
        if self.warm_pool > 0:
            ensure_pool(self.warm_pool, prestart=self.settings.warm_pool_user_code,
                        confinement=confinement, near_node_id=near,
                        fork=self.settings.fork_workers)
        else:
            self._drain_pool()

    def _spare_names(self) -> set[str]:
        return self.spares.names() if self.spares is not None else set()

    def _schedule_pass(self) -> None:
        if self.scheduler is not None and self.is_leader and not self._elected.is_set():
            self.scheduler.tick()
            if self.spares is not None:
                self.spares.top_up()  # after the launches: they take spares first

    def _poll_pass(self) -> None:
        if not self.is_leader:
            return
        if self._elected.is_set():  # took over from another process: reconcile first
            self._reconcile()
            return
        self.poller.tick()
        now = time.monotonic()
        if now - self._last_sweep > _SWEEP_EVERY_S:
            self._last_sweep = self._last_node_look = now
            sweep_orphans(self.store, launching=self._launching, spares=self._spare_names())
            self.register_nodes()
        elif now - self._last_node_look > _NODES_EVERY_S:
            self._last_node_look = now
            if nodes_changed(self.store):  # a node joined or was lost: the cluster view now
                self.register_nodes()

    def _usage_pass(self) -> None:
        if self.is_leader:
            self.samplers.sample(self.store, retention_s=self.settings.usage_retention_s)
        else:
            self.samplers.close()  # a standby samples nothing: its actors would only idle

    # -- nodes ----------------------------------------------------------------------------
    def register_nodes(self) -> None:
        """Writes Ray's live nodes joined with their topology into the store (GET /v1/cluster)."""
        register_nodes(self.store, self.topology)

    def poke(self) -> None:
        """Runs the scheduler and poller loops now: a submission through the API calls it, so
        the job is placed without waiting for the scheduler's next tick (node usage keeps its
        own interval)."""
        for loop in self._loops:
            if loop.pokeable:
                loop.poke()

    def _drain_pool(self) -> None:
        drain_pool()

    def pool_status(self, *, max_age_s: float = 2.0) -> dict[str, Any] | None:
        """The warm pool's status (WorkerPool.status), at most `max_age_s` old."""
        return self._pool_view.status(max_age_s=max_age_s) if self.warm_pool > 0 else None

    def wait_for_pool(self, *, timeout_s: float = 120.0) -> dict[str, int]:
        """Blocks until the warm pool holds `warm_pool` ready actors on every CPU node."""
        return wait_for_pool(self.warm_pool, timeout_s=timeout_s)


def _calibrated_figures(data_dir: Path) -> LinkFigures | None:
    try:
        return load_figures(data_dir)
    except (OSError, ValueError) as exc:  # a damaged calibration file must not stop placing
        log.warning("ignoring calibration %s: %s", calibration_path(data_dir), exc)
        return None


def build_runtime(*, settings: Settings, store: Store, api_port: int | None = None) -> Runtime:
    """`api_port`: the port the API really listens on (`--port 0` picks one), which every
    job's ranks are kept out of. MESHYARD_WARM_POOL (Settings.resolved_warm_pool): warm
    actors per CPU node, 0 = off."""
    return Runtime(settings, store, api_port=api_port)
