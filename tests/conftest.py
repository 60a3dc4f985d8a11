"""Shared fixtures: database URLs for SQLite and PostgreSQL, and the samples folder.

PostgreSQL cases run when MESHYARD_TEST_POSTGRES_URL is set (`.ci/run` sets it to the local
server); each test gets a fresh database, dropped afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Ray reads this when it is imported: every local Ray and simulated cluster in the tests then
# binds 127.0.0.1 instead of the machine's public address (ARCHITECTURE.md, machine facts).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

FIXTURES = Path(__file__).parent / "fixtures"
PG_ENV = "MESHYARD_TEST_POSTGRES_URL"


def _pg_base_url() -> str | None:
    return os.environ.get(PG_ENV) or None


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meshyard.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test; skipped without MESHYARD_TEST_POSTGRES_URL."""
    base = _pg_base_url()
    if not base:
        pytest.skip(f"{PG_ENV} is not set (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)")
    from tests.postgres import scratch_postgres_database

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
    """Folders with the longest tests first; each folder's modules, and each module's tests,
    kept together and in order, so a run that fails on a slow module says so early. `make
    test` hands whole modules to its two xdist workers in this order (a package-scoped Ray
    cluster starts once in each worker that runs a module of that package)."""
    first: dict[Path, int] = {}
    rank: dict[Path, int] = {}
    for i, item in enumerate(items):
        folder = Path(str(item.path)).parent
        first.setdefault(folder, i)
        rank[folder] = min(rank.get(folder, 2), _rank(item))
    items.sort(key=lambda it: (rank[Path(str(it.path)).parent], first[Path(str(it.path)).parent]))
