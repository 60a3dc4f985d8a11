"""The calibration fit and store are pure like placement/ (test_pure_imports.py covers that)."""

from __future__ import annotations

import json
import subprocess
import sys

MODULES = ["orchestrator.planner.calibration.fit", "orchestrator.planner.calibration.figures",
           "orchestrator.planner.calibration.probes", "orchestrator.planner.calibration.report",
           "orchestrator.planner.planner", "orchestrator.planner.autoplan",
           "orchestrator.planner.plan_layout"]


def test_no_torch_ray_fastapi_sqlalchemy() -> None:
    code = ("import importlib, json, sys\n"
            f"for m in {MODULES!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'ray', 'fastapi', 'sqlalchemy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == []
