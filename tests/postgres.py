"""The PostgreSQL server the tests use, and throwaway databases on it.

`postgres_base_url()` is the one place that decides whether PostgreSQL cases run: an explicit
MESHYARD_TEST_POSTGRES_URL wins (a server that then does not answer fails those tests rather
than skipping them); otherwise the local server `.ci/run` uses (127.0.0.1:5432, database
`test`, user postgres) is used when it answers; otherwise `postgres_skip_reason()` says why
the PostgreSQL cases skip.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

PG_ENV = "MESHYARD_TEST_POSTGRES_URL"
LOCAL_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@functools.cache
def _detect() -> tuple[str | None, str]:
    """(base URL, how it was chosen or why there is none); probed once per process."""
    explicit = os.environ.get(PG_ENV)
    if explicit:
        return explicit, f"{PG_ENV} ({explicit})"
    try:
        import psycopg
    except ImportError as e:
        return None, (f"{PG_ENV} is not set and psycopg is not installed ({e}); "
                      "install meshyard[postgres] to run the PostgreSQL cases")
    try:
        with psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="test",
                             connect_timeout=3):
            pass
    except Exception as e:  # noqa: BLE001 - any failure to connect means "no local server"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, (f"{PG_ENV} is not set and no PostgreSQL answers at {LOCAL_POSTGRES_URL} "
                      f"({first})")
    return LOCAL_POSTGRES_URL, f"the local server at {LOCAL_POSTGRES_URL} ({PG_ENV} not set)"


def postgres_base_url() -> str | None:
    """The server URL PostgreSQL cases run against, or None when they skip."""
    return _detect()[0]


def postgres_source() -> str:
    """Where the URL came from, or, when there is none, why PostgreSQL cases skip."""
    return _detect()[1]


@contextmanager
def scratch_postgres_database(base_url: str, *, prefix: str = "meshyard_t_") -> Iterator[str]:
    """Creates a fresh database on the server of `base_url` and yields its URL; drops it
    (ending any connection still open to it) on exit."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = prefix + secrets.token_hex(4)
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :n"), {"n": name})
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
