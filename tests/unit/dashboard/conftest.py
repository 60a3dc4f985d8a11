"""Fixtures of the dashboard's route tests: a migrated SQLite store with an admin token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.store.db import make_engine, upgrade_database
from orchestrator.store.repo import Store

TOKEN = "unit-admin-token"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'meshyard.db'}"
    upgrade_database(url)
    s = Store(make_engine(url))
    s.ensure_admin(TOKEN)
    yield s
    s.close()
