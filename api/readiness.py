"""Readiness: the schema is at the newest Alembic revision and the store answers queries.

Reading the revision alone is not enough: a damaged SQLite file (its locks lost, its WAL
discarded) can still serve the small alembic_version page from cache while every query on the
job tables fails, so the probe also reads the newest job and a user through the same engine.
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from api.schemas import Readiness
from orchestrator.store import models as m
from orchestrator.store.db import current_revision, head_revision


@lru_cache(maxsize=1)
def _head() -> str | None:
    return head_revision()  # reads the migration scripts once per process


def _query_store(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(select(m.Job.seq, m.Job.state).order_by(m.Job.seq.desc()).limit(1)).all()
        conn.execute(select(m.User.id, m.User.name).limit(1)).all()


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
    try:
        _query_store(engine)
    except SQLAlchemyError as exc:
        return Readiness(status="not_ready", database=False, migrations=True,
                         detail=f"the store cannot answer a query: {type(exc).__name__}; "
                         "see the server log")
    return Readiness(status="ready", database=True, migrations=True)
