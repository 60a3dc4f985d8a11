"""Landlock confinement of what the control plane starts (real kernel, real processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.runtime.sandbox import landlock_abi, run_confined

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock; "
                                "the runtime then starts Ray unconfined and says so")

READ = [sys.executable, "-c", "import sys; print(open(sys.argv[1]).read(), end='')"]


def _tree(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "runs").mkdir(parents=True)
    (data / "admin.token").write_text("msy_secret\n")
    (data / "runs" / "log.txt").write_text("rank 0\n")
    (tmp_path / "beside.txt").write_text("beside\n")
    return data


def test_children_of_the_confined_thread_cannot_read_private_files(tmp_path: Path) -> None:
    data = _tree(tmp_path)

    def start() -> list[subprocess.CompletedProcess[str]]:
        return [subprocess.run([*READ, str(p)], capture_output=True, text=True, timeout=60)
                for p in (data / "admin.token", data / "runs" / "log.txt",
                          tmp_path / "beside.txt", Path("/etc/hostname"))]

    (secret, run_log, beside, system), how = run_confined(
        start, private=data, open_inside=[data / "runs"])
    assert how.active, how.detail
    assert secret.returncode != 0 and "Permission denied" in secret.stderr
    assert secret.stdout == ""
    assert run_log.stdout == "rank 0\n" and beside.stdout == "beside\n"
    assert system.returncode == 0
    # The calling process itself is not confined.
    assert (data / "admin.token").read_text() == "msy_secret\n"


def test_grandchildren_and_magic_links_are_confined_too(tmp_path: Path) -> None:
    data = _tree(tmp_path)
    holder = open(data / "admin.token")  # noqa: SIM115 - an fd of the unconfined process
    try:
        code = ("import os, subprocess, sys\n"
                f"print(subprocess.run(['cat', {str(data / 'admin.token')!r}],"
                " capture_output=True, text=True).returncode)\n"
                f"try:\n    open('/proc/{__import__('os').getpid()}/fd/{holder.fileno()}').read()"
                "\n    print('read')\nexcept OSError as e:\n    print('denied', e.errno)\n")

        def start() -> str:
            return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=60).stdout

        out, how = run_confined(start, private=data)
    finally:
        holder.close()
    assert how.active
    cat_rc, fd_read = out.split("\n")[:2]
    assert cat_rc != "0" and fd_read.startswith("denied"), out
