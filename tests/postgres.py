"""A throwaway PostgreSQL database for tests and benchmarks: created, yielded, dropped."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager


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
