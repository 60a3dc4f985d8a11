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
        assert is_at_head(engine) and head_revision() == "0009"
    finally:
        engine.dispose()


def test_roles_and_tokens_survive_the_upgrade_to_roles(db_url: str) -> None:
    """0003 turns is_admin into a role; every user keeps their rights and tokens."""
    from datetime import UTC, datetime

    from sqlalchemy import text

    from orchestrator.admission.access import Role
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


def test_metrics_rows_survive_the_upgrade_to_the_compression_and_moe_columns(db_url: str
                                                                              ) -> None:
    """0006 adds grad_comm_bytes, grad_compression_ratio and moe_aux_loss to metrics: rows
    written before it read back with the new fields null; new rows store them (bytes past
    2**31 included); the downgrade drops the columns and keeps the rows."""
    from alembic import command
    from sqlalchemy import inspect, text

    from orchestrator.spec import parse_spec
    from orchestrator.store.db import alembic_config
    from orchestrator.store.repo import Store

    upgrade_database(db_url, revision="0005")
    engine = make_engine(db_url)
    try:
        store = Store(engine)
        job, _ = store.submit_job(parse_spec({"name": "m"}), owner="admin")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO metrics (job_id, attempt, rank, step, time, loss) "
                              "VALUES (:j, 1, 0, 1, 1.0, 2.5)"), {"j": job.id})
        upgrade_database(db_url)
        store.add_metrics(job.id, 1, [{"rank": 0, "step": 2, "time": 2.0, "loss": 2.0,
                                       "grad_comm_bytes": 3 << 31,
                                       "grad_compression_ratio": 49.9,
                                       "moe_aux_loss": 1.02}])
        old, new = store.list_metrics(job.id)
        assert (old.loss, old.grad_comm_bytes, old.grad_compression_ratio,
                old.moe_aux_loss) == (2.5, None, None, None)
        assert (new.grad_comm_bytes, new.grad_compression_ratio, new.moe_aux_loss) == (
            3 << 31, 49.9, 1.02)
        cfg = alembic_config(db_url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0005")
        cols = {c["name"] for c in inspect(engine).get_columns("metrics")}
        assert "moe_aux_loss" not in cols and "lr" in cols
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM metrics")).scalar() == 2
    finally:
        engine.dispose()


def test_package_owners_are_taken_from_the_jobs_that_ran_them(db_url: str) -> None:
    """0007 records who uploaded which package; packages stored before it belong to the
    users whose jobs named them (and to nobody else)."""
    from alembic import command
    from sqlalchemy import inspect

    from orchestrator.spec import parse_spec
    from orchestrator.store.db import alembic_config
    from orchestrator.store.repo import Store

    digest = "ab" * 32
    upgrade_database(db_url, revision="0006")
    engine = make_engine(db_url)
    try:
        store = Store(engine)
        spec = parse_spec({"name": "code", "entrypoint": {
            "command": ["python", "t.py"], "working_dir": f"package:sha256:{digest}"}})
        store.submit_job(spec, owner="ann")
        store.submit_job(spec, owner="ann")
        store.submit_job(parse_spec({"name": "builtin"}), owner="bob")
        upgrade_database(db_url)
        assert store.owns_package(digest, "ann") and not store.owns_package(digest, "bob")
        assert store.add_package_owner(digest, "bob") and not store.add_package_owner(digest,
                                                                                       "bob")
        cfg = alembic_config(db_url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0006")
        assert "package_owners" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_metric_rows_survive_the_upgrade_to_metric_values(db_url: str) -> None:
    """0008 adds metric_values and metric_keys: rows written before it read back unchanged
    (with no extra values); new rows store their extra keys; the downgrade drops both tables
    and keeps the metrics rows."""
    from alembic import command
    from sqlalchemy import inspect, text

    from orchestrator.spec import parse_spec
    from orchestrator.store.db import alembic_config
    from orchestrator.store.repo import Store

    upgrade_database(db_url, revision="0007")
    engine = make_engine(db_url)
    try:
        store = Store(engine)
        job, _ = store.submit_job(parse_spec({"name": "m"}), owner="admin")
        with engine.begin() as conn:
            for step in (1, 2):
                conn.execute(text("INSERT INTO metrics (job_id, attempt, rank, step, time, loss) "
                                  "VALUES (:j, 1, 0, :s, :s, 2.5)"), {"j": job.id, "s": step})
        upgrade_database(db_url)
        assert store.list_metric_keys(job.id) == []
        store.add_metrics(job.id, 1, [{"rank": 0, "step": 3, "time": 3.0, "loss": 2.0,
                                       "val_acc": 0.75}])
        assert [x.loss for x in store.list_metrics(job.id)] == [2.5, 2.5, 2.0]
        assert store.list_extra_values(job.id, rank=0, first_step=1, last_step=3,
                                       keys=None) == {(1, 0, 3): {"val_acc": 0.75}}
        page = store.metric_series(job.id, keys=["loss", "val_acc"], ranks=[0], points=10)
        assert [(x.key, x.step) for x in page.series] == [("loss", [1, 2, 3]),
                                                         ("val_acc", [3])]
        cfg = alembic_config(db_url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
        tables = set(inspect(engine).get_table_names())
        assert "metric_values" not in tables and "metric_keys" not in tables
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM metrics")).scalar() == 3
    finally:
        engine.dispose()


def test_rank_rows_survive_the_upgrade_to_rank_progress(db_url: str) -> None:
    """0009 adds a rank's collective progress: rows written before it read back with none;
    new rows keep the count and its dates; the downgrade drops the columns, not the rows."""
    from datetime import UTC, datetime

    from alembic import command
    from sqlalchemy import text

    from orchestrator.spec import parse_spec
    from orchestrator.store.db import alembic_config
    from orchestrator.store.repo import Store

    upgrade_database(db_url, revision="0008")
    engine = make_engine(db_url)
    try:
        store = Store(engine)
        job, _ = store.submit_job(parse_spec({"name": "r"}), owner="admin")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO ranks (job_id, attempt, rank, coords, state, step) "
                              "VALUES (:j, 1, 0, '{}', 'RUNNING', 3)"), {"j": job.id})
        upgrade_database(db_url)
        old = store.list_ranks(job.id, attempt=1)
        assert [(x.step, x.collectives, x.progress_at) for x in old] == [(3, None, None)]
        first, last = datetime(2026, 12, 4, 12, 0, tzinfo=UTC), datetime(2026, 12, 4, 12, 5,
                                                                          tzinfo=UTC)
        store.upsert_ranks(job.id, 1, [{"rank": 1, "state": "RUNNING", "collectives": 2**40,
                                        "progress_first_at": first, "progress_at": last}])
        new = store.rank_zero_rows(job.id) + store.list_ranks(job.id, attempt=1)[1:]
        assert [(x.rank, x.collectives, x.progress_first_at, x.progress_at) for x in new] == [
            (0, None, None, None), (1, 2**40, first, last)]
        cfg = alembic_config(db_url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0008")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM ranks")).scalar() == 2
    finally:
        engine.dispose()
