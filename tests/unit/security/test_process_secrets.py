"""The server's secrets leave /proc: masked in its start-up memory, and its /proc files
closed to other processes of the same (non-root) user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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


def _start(mode: str, pythonpath: Path, *, python: str = sys.executable,
           prefix: list[str] | None = None) -> subprocess.Popen[str]:
    """Starts the child and returns once it has done its work (its first line); fails, with
    the child's stderr, when it did not get that far (e.g. it could not import the module)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pythonpath),
           "MESHYARD_ADMIN_TOKEN": SECRET_TOKEN, "MESHYARD_DATABASE_URL": SECRET_URL}
    proc = subprocess.Popen([*(prefix or []), python, "-c", CHILD, mode, "serve",
                             "--database-url", SECRET_URL], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().strip()
    if not line or proc.poll() is not None:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"the {mode} child did not start (exit {proc.returncode}, first line "
                    f"{line!r}): {err.strip()}")
    assert line.startswith("plain" if mode == "plain" else "masked "), (mode, line)
    return proc


@pytest.fixture(scope="module")
def readable_module() -> Iterator[Path]:
    """A copy of api/process_secrets.py (stdlib only) in a folder any user can read: the
    child may run as uid 65534, which cannot read a checkout under a private (0700) folder."""
    root = Path(tempfile.mkdtemp(prefix="meshyard-proc-secrets-"))
    try:
        (root / "api").mkdir()
        (root / "api" / "__init__.py").write_text("")
        shutil.copyfile(REPO / "api" / "process_secrets.py", root / "api" / "process_secrets.py")
        for path in (root, root / "api"):
            path.chmod(0o755)
        for path in (root / "api").iterdir():
            path.chmod(0o644)
        yield root
    finally:
        shutil.rmtree(root)


def _read(pid: int, name: str, *, prefix: list[str] | None = None) -> str:
    out = subprocess.run([*(prefix or []), "cat", f"/proc/{pid}/{name}"], capture_output=True,
                         timeout=30)
    return out.stdout.decode(errors="replace") if out.returncode == 0 else "DENIED"


def test_secrets_are_masked_in_environ_and_cmdline(readable_module: Path) -> None:
    for mode, visible in (("plain", True), ("hide", False)):
        proc = _start(mode, readable_module)
        try:
            seen = _read(proc.pid, "environ") + _read(proc.pid, "cmdline")
            assert (SECRET_URL in seen and SECRET_TOKEN in seen) is visible, (mode, seen)
            assert "serve" in seen and "--database-url" in seen  # only the values are gone
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="needs root to run the two processes as another user")
def test_same_user_processes_cannot_open_its_proc_files(readable_module: Path) -> None:
    for mode, readable in (("plain", True), ("hide", False)):
        proc = _start(mode, readable_module, python="/usr/bin/python3", prefix=NOBODY)
        try:
            seen = _read(proc.pid, "environ", prefix=NOBODY)
            assert proc.poll() is None, f"the {mode} child exited before its /proc was read"
            assert (seen != "DENIED") is readable, (mode, seen)
        finally:
            proc.kill()
            proc.wait()
