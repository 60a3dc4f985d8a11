"""Persistence: SQLAlchemy models, Alembic-managed schema, and the Store facade."""

from orchestrator.store.db import make_engine, upgrade_database
from orchestrator.store.jobs import BadCursor, JobNotFound
from orchestrator.store.repo import Store


def open_store(url: str, *, migrate: bool = True) -> Store:
    """Applies migrations (unless told not to) and returns a Store on `url`."""
    if migrate:
        upgrade_database(url)
    return Store(make_engine(url))


__all__ = ["BadCursor", "JobNotFound", "Store", "make_engine", "open_store", "upgrade_database"]
