"""Alembic is the only way the schema changes: models and migrations must agree."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from orchestrator.store.db import head_revision, is_at_head, make_engine, upgrade_database
from orchestrator.store.models import Base


def test_models_match_migrations(db_url: str) -> None:
    upgrade_database(db_url)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == [], f"models and migrations differ; write a migration: {diff}"
        assert is_at_head(engine)
    finally:
        engine.dispose()


def test_upgrade_is_idempotent(db_url: str) -> None:
    upgrade_database(db_url)
    upgrade_database(db_url)
    engine = make_engine(db_url)
    try:
        assert is_at_head(engine) and head_revision() == "0003"
    finally:
        engine.dispose()
