"""The watchdog's pure core imports no torch / ray / fastapi / sqlalchemy (ARCHITECTURE.md)."""

from __future__ import annotations

import subprocess
import sys

PURE = ["orchestrator.watchdog.analyze", "orchestrator.watchdog.report",
        "orchestrator.watchdog.flight_recorder", "orchestrator.watchdog.logs",
        "orchestrator.watchdog.detect", "orchestrator.watchdog.inputs",
        "orchestrator.watchdog.offline", "orchestrator.watchdog.locate",
        "orchestrator.watchdog.monitor", "orchestrator.watchdog.log_prefixes",
        "orchestrator.watchdog.log_patterns", "orchestrator.watchdog.log_torch",
        "orchestrator.watchdog.log_blocks", "orchestrator.watchdog.log_elastic"]


def test_pure_modules_import_no_heavy_frameworks() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in PURE) +
            "bad = [m for m in ('torch', 'ray', 'fastapi', 'sqlalchemy') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"
