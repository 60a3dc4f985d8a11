"""Architecture rule: the pure core imports no Ray, FastAPI, SQLAlchemy or torch.

Each module is imported in a fresh interpreter (so nothing is preloaded by pytest or other
tests) and sys.modules is checked after every import, naming the module that pulled one in.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("ray", "fastapi", "sqlalchemy", "torch")

PURE = [
    "orchestrator.ansi",
    "orchestrator.spec",
    "orchestrator.lifecycle",
    "orchestrator.topology.model",
    "orchestrator.topology.nvidia_smi",
    "orchestrator.topology.nvml",
    "orchestrator.topology.infiniband",
    "orchestrator.topology.nccl_xml",
    "orchestrator.topology.labels",
    "orchestrator.topology.serialize",
    "orchestrator.topology.declared",
    "orchestrator.topology.discovery",  # takes ray as a parameter, imports it lazily
]
OPTIONAL = ["orchestrator.watchdog.analyze"]

SCRIPT = """
import importlib, json, sys
forbidden = {forbidden!r}
out = {{}}
for name in {modules!r}:
    importlib.import_module(name)
    out[name] = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps(out))
"""


def _modules() -> list[str]:
    mods = list(PURE)
    placement = ROOT / "orchestrator" / "placement"
    if placement.is_dir():
        mods.append("orchestrator.placement")
        mods += [f"orchestrator.placement.{m.name}" for m in pkgutil.iter_modules([str(placement)])]
    mods += [m for m in OPTIONAL if (ROOT / (m.replace(".", "/") + ".py")).exists()]
    return mods


def test_pure_modules_load_no_heavy_frameworks():
    modules = _modules()
    assert "orchestrator.topology.nvidia_smi" in modules
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(forbidden=FORBIDDEN, modules=modules)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert list(loaded) == modules
    offenders = {}
    previous: set[str] = set()
    for name in modules:
        new = set(loaded[name]) - previous
        if new:
            offenders[name] = sorted(new)
        previous |= set(loaded[name])
    assert offenders == {}, f"pure modules pulled in heavy frameworks: {offenders}"


def test_the_check_can_fail():
    # The same probe sees a heavy import when there is one (guards against a vacuous test).
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(forbidden=FORBIDDEN, modules=["sqlalchemy"])],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    assert "sqlalchemy" in json.loads(proc.stdout)["sqlalchemy"]
