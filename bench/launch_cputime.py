"""``workers.loop.launch`` with one extra metrics field, ``cpu_time`` (this process's CPU seconds).

    torchrun --nproc_per_node=2 bench/launch_cputime.py --spec S --out D

bench/throughput.py runs meshyard through this so that both loops report the same per-step
CPU figure (bench/ddp_baseline.py records ``time.process_time()`` after ``optimizer.step()``).
The training path is ``workers.loop.launch.main`` unchanged; only the step's metrics row gains the
field, read where the step's row is made (after ``optimizer.step()``, not when the row
reaches the metrics file: rows arrive in batches at the loop's sync steps), one
``process_time()`` call per step.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from workers.loop import train as loop
from workers.loop.launch import main

_one_step = loop._one_step


def _one_step_with_cpu(*args: Any, **kwargs: Any) -> Any:
    row, loss = _one_step(*args, **kwargs)
    row["cpu_time"] = time.process_time()
    return row, loss


loop._one_step = _one_step_with_cpu  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(main())
