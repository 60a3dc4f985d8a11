"""``workers.launch`` with one extra metrics field, ``cpu_time`` (this process's CPU seconds).

    torchrun --nproc_per_node=2 bench/launch_cputime.py --spec S --out D

bench/throughput.py runs meshyard through this so that both loops report the same per-step
CPU figure (bench/ddp_baseline.py records ``time.process_time()`` at the same point). The
training path is ``workers.launch.main`` unchanged; only rank 0's metrics callback adds the
field, one ``process_time()`` call per step.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from workers import callbacks
from workers.launch import main

_on_step = callbacks.FileCallbacks.on_step


def _on_step_with_cpu(self: callbacks.FileCallbacks, metrics: dict[str, Any]) -> None:
    _on_step(self, {**metrics, "cpu_time": time.process_time()})


callbacks.FileCallbacks.on_step = _on_step_with_cpu  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
