"""Shared fixtures: database URLs for SQLite and PostgreSQL, and the samples folder.

PostgreSQL cases run against MESHYARD_TEST_POSTGRES_URL when it is set, else against the local
server on 127.0.0.1:5432 when one answers (tests/postgres.py decides), and skip with the
reason otherwise; each test gets a fresh database, dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Ray reads this when it is imported: every local Ray and simulated cluster in the tests then
# binds 127.0.0.1 instead of the machine's public address (ARCHITECTURE.md, machine facts).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# The simulated clusters start their worker processes as the local Ray `meshyard serve` starts
# does (orchestrator/runtime/service.py, LOCAL_RAY_CONFIG): none before there is work for one.
# Ray's default is an idle worker per CPU once the first driver connects, and more for a
# backlog: a CPU-second each, for processes meshyard's actors never run in.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("RAY_enable_worker_prestart", "0")
# Ray's own telemetry, which nothing in meshyard or its tests reads (every cluster here runs
# without Ray's dashboard): each worker's metrics exported to its node's agent, each worker's
# task events sent to the GCS every second, and each node agent's node and worker stats every
# 5 s. Off, a 4-node simulated cluster running tasks and actor calls spends about an
# eighth less CPU (bench/ray_telemetry.py).
os.environ.setdefault("RAY_enable_metrics_collection", "0")
os.environ.setdefault("RAY_task_events_report_interval_ms", "0")
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")

FIXTURES = Path(__file__).parent / "fixtures"
# Confined ranks add the ports they close to this host sysctl (meshyard/_confine.py,
# reserve_ephemeral); the run leaves it as it found it.
RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        with contextlib.suppress(OSError):
            config.stash[_reserved_key] = RESERVED_PORTS.read_text().strip()
        _timeline_speed("start")
    elif FILLER_NICE and config.workerinput["workercount"] >= 3 and \
            config.workerinput["workerid"] == f"gw{config.workerinput['workercount'] - 1}":
        os.nice(FILLER_NICE)  # the filler and what it starts yield to the front workers


def _filler_nice() -> int:
    """MESHYARD_TEST_FILLER_NICE=N (10 unless set): with three workers or more, the filler
    (the last worker) runs at nice N and takes no FILLER_LAST group (those go to the front
    workers in queue order), so its tests use the CPU the scenarios leave idle instead of
    slowing them. 0: the filler runs at the front workers' priority and takes the lab last.
    The raylets start Ray's worker processes (worker actors, their ranks, attempt
    controllers, task workers) at nice 15, Ray's default: at 10 the filler yields to the
    front workers' drivers, servers, CLI runs and torchrun ranks, not to their Ray workers;
    at 19 it yields to all of them (bench/README.md, "Three workers")."""
    try:
        return max(0, min(19, int(os.environ.get("MESHYARD_TEST_FILLER_NICE", "10"))))
    except ValueError:
        return 10


FILLER_NICE = _filler_nice()


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    _timeline_speed("end")
    before = config.stash.get(_reserved_key, None)
    if before is not None:
        with contextlib.suppress(OSError):
            RESERVED_PORTS.write_text(before or "\n")


_reserved_key = pytest.StashKey[str]()


def pytest_report_header(config: pytest.Config) -> str:
    from tests.postgres import postgres_base_url, postgres_source

    if postgres_base_url():
        return f"postgresql: {postgres_source()}"
    return f"postgresql: cases skip: {postgres_source()}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meshyard.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test; skipped, with the reason, when there is no
    server (tests/postgres.py)."""
    from tests.postgres import postgres_base_url, postgres_source, scratch_postgres_database

    base = postgres_base_url()
    if not base:
        pytest.skip(postgres_source())

    with scratch_postgres_database(base) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs the test on SQLite and on PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(autouse=True, scope="module")
def _no_ray_connection_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module that leaves this process connected to Ray would make the next module's
    ray.init() fail or, worse, run on the wrong cluster: disconnect and say who leaked."""
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        print(f"\n[conftest] {request.module.__name__} left Ray initialized; shutting it down",
              file=sys.stderr)
        ray.shutdown()



def _rank(item: pytest.Item) -> int:
    """0: a slow test (real Ray jobs, torchrun launches) or a browser test, 1: other tests
    outside tests/unit, 2: unit tests."""
    if item.get_closest_marker("slow") is not None or item.get_closest_marker("browser"):
        return 0
    return 2 if "unit" in Path(str(item.path)).relative_to(Path(__file__).parent).parts else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The XDIST_GROUPS groups first (the longest units of work, in the order listed), then
    the LONG_MODULES, then folders with the longest tests; each folder's modules, and each
    module's tests, kept together and in order, so a run that fails on a slow module says
    so early. `make test` hands whole modules, or the groups, to its xdist workers in this
    order: the longest first, so that no long unit starts late and ends the run alone."""
    groups = {g: i for i, g in enumerate(dict.fromkeys(XDIST_GROUPS.values()))}
    first: dict[Path, int] = {}
    rank: dict[Path, int] = {}
    for i, item in enumerate(items):
        folder = Path(str(item.path)).parent
        first.setdefault(folder, i)
        rank[folder] = min(rank.get(folder, 2), _rank(item))

    def key(it: pytest.Item) -> tuple[int, int, int, int]:
        folder = Path(str(it.path)).parent
        scope = xdist_scope(it.nodeid)
        return (groups.get(scope, len(groups)), scope not in LONG_MODULES, rank[folder],
                first[folder])

    items.sort(key=key)


# Test files whose modules share a package-scoped Ray cluster, or a machine-wide resource that
# only one of them may hold at a time, by path prefix -> group. Under `make test` (--dist
# loadfile) a group goes to one xdist worker as one unit, as a module does: its cluster
# starts once in the run instead of once in each worker, and its modules run one after the
# other.
XDIST_GROUPS = {
    "tests/integration/runtime/": "runtime-cluster",  # its conftest's ray_cluster
    "tests/integration/watchdog/test_runtime_hangs.py": "watchdog-ray",  # its conftest's
    "tests/integration/watchdog/test_user_hangs.py": "watchdog-ray",
    # one lab a machine (deploy/lab: its bridge, namespaces and state dir have fixed names);
    # each module brings its own up and down
    "tests/lab/": "lab",
}


# Modules long enough to end the run alone if they started last (a minute or more of one
# module-scoped service): handed out right after the groups.
LONG_MODULES = ("tests/security/hostile/test_hostile_jobs.py",)


# With three xdist workers or more, the last one (the filler) takes, from the back of the
# queue, the modules that start no Ray and no torch.distributed job (in-process tests; the
# API's, the database's and the dashboard's, whose servers, CLI runs and browser need nothing
# but CPU), then the FILLER_LAST groups (the lab, whose scenarios mostly wait on failure
# detection), then stops. The other workers leave these to it while anything else is left.
FILLER_FOLDERS = ("tests/unit/", "tests/integration/api/", "tests/integration/store/",
                  "tests/e2e/")
FILLER_EXCLUDED = (  # services that run jobs on a local Ray
    "tests/integration/api/test_ray_train_driver.py", "tests/e2e/test_dashboard_runtime.py",
    "tests/e2e/test_dashboard_reading.py")
FILLER_LAST = ("lab",)


def filler_scope(scope: str) -> bool:
    """A unit the filler takes before the FILLER_LAST groups."""
    return scope.startswith(FILLER_FOLDERS) and scope not in FILLER_EXCLUDED


def xdist_scope(nodeid: str) -> str:
    """The unit `make test` gives one worker: an XDIST_GROUPS group, else the test file."""
    path = nodeid.split("::", 1)[0]
    return next((group for prefix, group in XDIST_GROUPS.items()
                 if path.startswith(prefix)), path)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with the files of an XDIST_GROUPS group kept together (xdist's
    own --dist loadgroup reads xdist_group marks from a node id suffix that pytest 9's node
    ids no longer carry, so it spreads a group's tests over both workers)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedClusterScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            """With three workers or more: the filler (the last worker) takes the last unit
            `filler_scope` allows, else a FILLER_LAST group, else stops; the others take the
            first unit that is neither, else the first one. The machine's idle time while
            the scenarios wait out thresholds and polls goes to tests that need only CPU,
            and at most one scenario beside the two front workers' starts a Ray cluster."""
            queue = self.workqueue
            if len(self.nodes) >= 3:
                last = max(self.nodes, key=lambda n: int(n.gateway.id.lstrip("gw") or 0))
                reserved = () if FILLER_NICE else FILLER_LAST
                if node is last:
                    pick = next((s for s in reversed(queue) if filler_scope(s)), None) or \
                        next((s for s in queue if s in reserved), None)
                    if pick is None:
                        node.shutdown()
                        return
                else:
                    pick = next((s for s in queue if not filler_scope(s)
                                 and s not in reserved), next(iter(queue)))
                queue.move_to_end(pick, last=False)
            super()._assign_work_unit(node)

    return SharedClusterScheduling(config, log)


def _timeline_speed(when: str) -> None:
    """With MESHYARD_TEST_TIMELINE=FILE, the machine's speed at the run's start and end goes
    to FILE as a line of its own (`speed`): the CPU-seconds of one process importing torch,
    torch._dynamo and torch.distributed, what every rank and worker actor imports
    (bench/interpreter.py's `torch` case). The same code's CPU moves by half with it from one
    run to the next on this kind of machine (bench/suite_timeline.py reads a run against it)."""
    path = os.environ.get("MESHYARD_TEST_TIMELINE")
    if not path:
        return
    import json
    import sys
    import time

    from bench.interpreter import cpu_of

    try:
        cpu = cpu_of(sys.executable, "torch")
    except SystemExit:  # the probe failed: the run goes on without the figure
        return
    with open(path, "a") as f:
        f.write(json.dumps({"speed": when, "time": time.time(),
                            "import_cpu_s": round(cpu, 2)}) + "\n")


def _machine_cpu_ticks() -> int:
    """user+nice+system of the machine's /proc/stat `cpu` line, in clock ticks."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[1]) + int(fields[2]) + int(fields[3])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With MESHYARD_TEST_TIMELINE=FILE, each test's worker, start, end (its fixtures'
    set-up and tear-down included) and the machine's CPU ticks at both ends go to FILE as one
    JSON line: where a run's time went, per module and per worker (bench/suite_timeline.py)."""
    path = os.environ.get("MESHYARD_TEST_TIMELINE")
    if not path:
        yield
        return
    import json
    import time

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    t0, c0 = time.time(), _machine_cpu_ticks()
    yield
    line = json.dumps({"worker": worker, "test": item.nodeid, "start": t0, "end": time.time(),
                       "ticks": _machine_cpu_ticks() - c0})
    with open(path, "a") as f:
        f.write(line + "\n")
