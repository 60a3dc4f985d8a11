"""Shared fixtures: database URLs for SQLite and PostgreSQL, and the samples folder.

PostgreSQL cases run when MESHYARD_TEST_POSTGRES_URL is set (`.ci/run` sets it to the local
server); each test gets a fresh database, dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
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
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = "meshyard_t_" + secrets.token_hex(4)
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"
            ), {"n": name})
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs the test on SQLite and on PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_url")
