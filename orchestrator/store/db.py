"""Engine construction and schema upgrades (Alembic is the only way the schema changes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
_MIGRATION_LOCK = 0x6D657368_79617264  # "meshyard": pg advisory key serialising upgrades


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets the API read while the scheduler writes; busy_timeout turns lock contention
    # from 50 concurrent submissions into short waits instead of "database is locked".
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for SQLite (file, WAL) or PostgreSQL (psycopg 3)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               pool_size=16, max_overflow=16, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if u.get_backend_name() == "postgresql" and u.drivername == "postgresql":
        url = str(u.set(drivername="postgresql+psycopg"))
    return create_engine(url, pool_pre_ping=True, pool_size=16, max_overflow=16, **kwargs)


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_database(url: str, *, revision: str = "head") -> None:
    """Applies migrations up to `revision` (idempotent)."""
    from alembic import command

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Replicas starting together (Kubernetes) must not race the same CREATE
                # TABLEs: the second waits here, then finds the schema at head.
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def is_at_head(engine: Engine) -> bool:
    return "alembic_version" in inspect(engine).get_table_names() and \
        current_revision(engine) == head_revision()
