"""Offline bootstrap: the CLI's only direct use of a database, refused while a server runs.

`meshyard token create --database-url URL` (and list / revoke) work on the database itself so
that a first admin token can be made before any server exists. A running server owns its
database: another process writing it (a SQLite file above all) can corrupt it, and a token
written into the wrong database is useless. So this refuses when the database has a live
scheduler lease (PostgreSQL: the advisory lock), or when a SQLite file's directory holds the
`server.json` of a process that is still alive. Everything else goes over the API.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from api.client import SERVER_FILE
from orchestrator.store.db import make_engine, upgrade_database
from orchestrator.store.leader import current_leader
from orchestrator.store.repo import Store


class ServerRunning(RuntimeError):
    pass


def _live_pid(server_file: Path) -> int | None:
    try:
        pid = int(json.loads(server_file.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, another user's
    return pid


def _refuse(why: str) -> ServerRunning:
    return ServerRunning(f"{why}; a running server owns its database. Use the API instead: "
                         "set MESHYARD_URL (and MESHYARD_TOKEN to an admin token) and leave "
                         "out --database-url")


def check_no_server(url: str) -> None:
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:"):
        pid = _live_pid(Path(str(u.database)).parent / SERVER_FILE)
        if pid is not None:
            raise _refuse(f"meshyard serve (pid {pid}) is running on {u.database}")
    engine = make_engine(url)
    try:
        if "leader_leases" in inspect(engine).get_table_names() or \
                engine.dialect.name == "postgresql":
            holder = current_leader(engine)
            if holder is not None:
                raise _refuse(f"a server ({holder}) holds the scheduler lease on this database")
    finally:
        engine.dispose()


@contextmanager
def offline_store(url: str) -> Iterator[Store]:
    """The store on `url` after the checks above, migrated to head."""
    check_no_server(url)
    upgrade_database(url)
    store = Store(make_engine(url))
    try:
        yield store
    finally:
        store.close()
