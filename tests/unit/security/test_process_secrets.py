"""The server's secrets leave /proc: masked in its start-up memory, and its /proc files
closed to other processes of the same (non-root) user."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SECRET_URL = "postgresql+psycopg://meshyard:hunter2-pw@db.internal:5432/meshyard"
SECRET_TOKEN = "msy_seeded-admin-token-value"
CHILD = ("import sys, time\n"
         "from api.process_secrets import hide_secrets\n"
         "if sys.argv[1] == 'hide':\n    print(hide_secrets(), flush=True)\n"
         "else:\n    print('plain', flush=True)\n"
         "time.sleep(60)\n")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _start(mode: str, *, python: str = sys.executable, prefix: list[str] | None = None
           ) -> subprocess.Popen[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
           "MESHYARD_ADMIN_TOKEN": SECRET_TOKEN, "MESHYARD_DATABASE_URL": SECRET_URL}
    proc = subprocess.Popen([*(prefix or []), python, "-c", CHILD, mode, "serve",
                             "--database-url", SECRET_URL], env=env, text=True,
                            stdout=subprocess.PIPE, cwd="/")
    assert proc.stdout is not None
    proc.stdout.readline()  # the child has done its work
    return proc


def _read(pid: int, name: str, *, prefix: list[str] | None = None) -> str:
    out = subprocess.run([*(prefix or []), "cat", f"/proc/{pid}/{name}"], capture_output=True,
                         timeout=30)
    return out.stdout.decode(errors="replace") if out.returncode == 0 else "DENIED"


def test_secrets_are_masked_in_environ_and_cmdline() -> None:
    for mode, visible in (("plain", True), ("hide", False)):
        proc = _start(mode)
        try:
            seen = _read(proc.pid, "environ") + _read(proc.pid, "cmdline")
            assert (SECRET_URL in seen and SECRET_TOKEN in seen) is visible, (mode, seen)
            assert "serve" in seen and "--database-url" in seen  # only the values are gone
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="needs root to run the two processes as another user")
def test_same_user_processes_cannot_open_its_proc_files() -> None:
    for mode, readable in (("plain", True), ("hide", False)):
        proc = _start(mode, python="/usr/bin/python3", prefix=NOBODY)
        try:
            time.sleep(0.1)
            seen = _read(proc.pid, "environ", prefix=NOBODY)
            assert (seen != "DENIED") is readable, (mode, seen)
        finally:
            proc.kill()
            proc.wait()
