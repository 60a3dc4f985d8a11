"""Started by Python at interpreter start-up (this directory is on PYTHONPATH): starts
meshyard's probe (meshyard/_probe.py) when RANK and MESHYARD_PROBE_DIR are set, as they are
in every worker of a launcher `meshyard watch` runs, then runs the next `sitecustomize.py`
on sys.path, the one this file shadows. Never raises: a broken probe must not stop the job."""

from __future__ import annotations

import os
import sys


def _start_probe() -> None:
    try:
        from meshyard import _probe

        _probe.start()
    except Exception as exc:  # noqa: BLE001
        print(f"meshyard: the probe did not start: {exc}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        d = os.path.abspath(entry or os.getcwd())
        path = os.path.join(d, "sitecustomize.py")
        if d != here and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                code = compile(f.read(), path, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": path})  # noqa: S102
            return


if os.environ.get("RANK") is not None and os.environ.get("MESHYARD_PROBE_DIR"):
    _start_probe()
try:
    _chain()
except Exception as exc:  # noqa: BLE001
    print(f"meshyard: the shadowed sitecustomize failed: {exc}", file=sys.stderr)
