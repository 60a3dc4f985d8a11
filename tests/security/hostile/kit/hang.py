"""A hostile job that hangs after its first step and answers the hang watchdog itself: it
replaces meshyard's probe answer with its own, which names the control plane's secrets as
its artifacts and holds a Flight Recorder "dump" that runs a command when unpickled."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

import meshyard._probe as probe
import meshyard.train


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _answer(config: dict[str, Any]):
    def answer(self: Any, req: Path) -> None:
        ask = json.loads(req.read_text())
        out = Path(ask["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "fr_trace.pkl").write_bytes(pickle.dumps(_Payload(config["marker"])))
        for name, target in config["links"].items():
            try:
                os.symlink(target, out / name)
            except OSError as exc:
                print(f"LINK-REFUSED {name}: {exc}", flush=True)
        (out / "probe.json").write_text(json.dumps({
            "id": ask["id"], "pid": os.getpid(), "artifacts": config["artifacts"],
            "user_frame": "hang.py:1 in main()", "top_frame": "hang.py:1 in main()",
            "stacks": {"MainThread": "hostile"}, "errors": []}))
        req.unlink()
    return answer


def main(config: dict[str, Any]) -> None:
    probe.Probe._answer = _answer(config)
    meshyard.train.report({"step": 1, "loss": 1.0})
    time.sleep(float(config.get("seconds", 120)))
