"""The other tenant's job: it writes a checkpoint of known bytes, then keeps running (its
processes, environment and files are what the hostile jobs go after)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def main(config: dict) -> None:
    ckpt = Path(os.environ["MESHYARD_CHECKPOINT_DIR"]) / "victim.bin"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(bytes.fromhex(config["bytes"]))
    print("VICTIM-READY", flush=True)
    deadline = time.monotonic() + float(config.get("seconds", 600))
    while time.monotonic() < deadline:
        time.sleep(0.5)
