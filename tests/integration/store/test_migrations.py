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
        assert is_at_head(engine) and head_revision() == "0005"
    finally:
        engine.dispose()


def test_roles_and_tokens_survive_the_upgrade_to_roles(db_url: str) -> None:
    """0003 turns is_admin into a role; every user keeps their rights and tokens."""
    from datetime import UTC, datetime

    from sqlalchemy import text

    from orchestrator.access import Role
    from orchestrator.store.repo import Store
    from orchestrator.store.users import hash_token

    upgrade_database(db_url, revision="0002")
    engine = make_engine(db_url)
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            for uid, name, admin in ((1, "root", True), (2, "ann", False)):
                conn.execute(text("INSERT INTO users (id, name, is_admin, created_at) "
                                  "VALUES (:i, :n, :a, :t)"),
                             {"i": uid, "n": name, "a": admin, "t": now})
                conn.execute(text("INSERT INTO api_tokens (user_id, token_hash, label, "
                                  "created_at, revoked) VALUES (:i, :h, '', :t, :r)"),
                             {"i": uid, "h": hash_token(f"tok-{name}"), "t": now, "r": False})
        upgrade_database(db_url)
        store = Store(engine)
        root, ann = store.authenticate("tok-root"), store.authenticate("tok-ann")
        assert root is not None and root.role == Role.ADMIN
        assert ann is not None and ann.role == Role.USER
    finally:
        engine.dispose()
