"""The control plane's private files stay private across restarts: the data dir 0700, the
SQLite database (and its WAL files), admin.token and server.json 0600 — also after someone
loosened them by hand."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.integration.api.conftest import Server


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_files_are_tightened_on_every_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = Server(data_dir=data).start()
    try:
        assert _mode(data) == 0o700
        for name in ("meshyard.db", "admin.token", "server.json"):
            assert _mode(data / name) == 0o600, name
        for wal in (data / "meshyard.db-wal", data / "meshyard.db-shm"):
            if wal.exists():
                assert _mode(wal) == 0o600, wal.name
    finally:
        srv.stop()
    data.chmod(0o755)
    for name in ("meshyard.db", "admin.token"):
        (data / name).chmod(0o644)
    srv.start()
    try:
        assert _mode(data) == 0o700
        assert _mode(data / "meshyard.db") == 0o600 and _mode(data / "admin.token") == 0o600
    finally:
        srv.stop()
