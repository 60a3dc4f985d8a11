"""The runner keeps what the user's code made alive until the process exits, as Python keeps
`__main__`'s globals: the user's objects are destroyed after its atexit handlers, never the
moment the code returns (a DDP model freed right after its last collective deadlocked a rank
in ~ProcessGroupGloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = """\
import atexit, os
def note(what):
    with open(os.environ["ORDER_LOG"], "a") as f:
        f.write(what + "\\n")
class Held:
    def __del__(self):
        note("destroyed")
held = Held()
atexit.register(note, "atexit")
note("returned")
"""


def _order(argv: list[str], cwd: Path, log: Path) -> list[str]:
    log.unlink(missing_ok=True)
    env = {**os.environ, "ORDER_LOG": str(log), "PYTHONPATH": f"{REPO}:{cwd}"}
    env.pop("MESHYARD_PROBE_DIR", None)
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return log.read_text().split()


@pytest.mark.parametrize("mode", ["script", "module", "code"])
def test_user_objects_outlive_the_code_as_under_python(tmp_path: Path, mode: str) -> None:
    (tmp_path / "train_order.py").write_text(SCRIPT)
    log = tmp_path / "order.log"
    plain = {"script": ["train_order.py"], "module": ["-m", "train_order"],
             "code": ["-c", SCRIPT]}[mode]
    target = {"script": ["train_order.py"], "module": ["train_order"], "code": [SCRIPT]}[mode]
    under_python = _order([sys.executable, *plain], tmp_path, log)
    under_runner = _order([sys.executable, "-m", "meshyard.runner", mode, *target],
                          tmp_path, log)
    assert under_python[:2] == ["returned", "atexit"]
    assert under_runner == under_python
