"""Readiness: the database answers and its schema is at the newest Alembic revision."""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from api.schemas import Readiness
from orchestrator.store.db import current_revision, head_revision


@lru_cache(maxsize=1)
def _head() -> str | None:
    return head_revision()  # reads the migration scripts once per process


def check_ready(engine: Engine) -> Readiness:
    try:
        current = current_revision(engine)
    except SQLAlchemyError as exc:
        return Readiness(status="not_ready", database=False, migrations=False,
                         detail=f"database unreachable: {type(exc).__name__}")
    head = _head()
    if current != head:
        return Readiness(status="not_ready", database=True, migrations=False,
                         detail=f"schema at {current or 'nothing'}, code expects {head}; "
                         "run `meshyard db upgrade`")
    return Readiness(status="ready", database=True, migrations=True)
