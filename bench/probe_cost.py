"""What meshyard's probe (meshyard/_probe.py) costs a training step: the plain DDP example
(examples/byo/ddp/train.py, no meshyard import) under torchrun, 2 ranks on gloo, with and
without the probe loaded in every rank the way `meshyard watch` loads it (meshyard/_autoprobe
on PYTHONPATH, MESHYARD_PROBE_DIR set, Flight Recorder on in both runs so only the probe
differs). Runs alternate (off, on, off, on, ...) so the shared machine's noise hits both.

Step time = the interval between rank 0's "step N" lines, read as they arrive, over the
steps after a warm-up (start-up and the first collectives are left out); median over runs.
No evidence is requested: this is the idle cost (watermark sampling every 0.25 s).

    .venv/bin/python bench/probe_cost.py [--runs 3] [--steps 3000]
                                         [--out bench/results/probe_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "byo" / "ddp" / "train.py"
AUTOPROBE = REPO / "meshyard" / "_autoprobe"
WARMUP = 200


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(*, probe: bool, steps: int) -> float:
    """Median seconds per step of one torchrun run."""
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    env.pop("MESHYARD_PROBE_DIR", None)
    with tempfile.TemporaryDirectory() as tmp:
        if probe:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(AUTOPROBE), str(REPO), env.get("PYTHONPATH", "")) if p)
            env["MESHYARD_PROBE_DIR"] = tmp
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               f"--master_port={_port()}", str(SCRIPT), "--steps", str(steps)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        stamps: dict[int, float] = {}
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step "):
                stamps[int(line.split()[1])] = time.perf_counter()
        if proc.wait() != 0:
            raise RuntimeError(f"torchrun failed ({proc.returncode})")
        if probe:
            assert any(Path(tmp).glob("rank*.progress.json")), "the probe did not start"
    gaps = [stamps[s] - stamps[s - 1] for s in range(WARMUP + 1, steps + 1)
            if s in stamps and s - 1 in stamps]
    return (stamps[steps] - stamps[WARMUP]) / (steps - WARMUP) if gaps else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "probe_cost.json")
    args = ap.parse_args()
    off: list[float] = []
    on: list[float] = []
    for i in range(args.runs):
        off.append(one_run(probe=False, steps=args.steps))
        on.append(one_run(probe=True, steps=args.steps))
        print(f"run {i + 1}: step without probe {off[-1] * 1e3:.3f} ms, "
              f"with probe {on[-1] * 1e3:.3f} ms", flush=True)
    m_off, m_on = statistics.median(off), statistics.median(on)
    result = {"steps": args.steps, "warmup": WARMUP, "runs": args.runs,
              "step_ms_without_probe": [x * 1e3 for x in off],
              "step_ms_with_probe": [x * 1e3 for x in on],
              "median_ms_without": m_off * 1e3, "median_ms_with": m_on * 1e3,
              "ratio_with_over_without": m_on / m_off}
    print(f"median step: {m_off * 1e3:.3f} ms without, {m_on * 1e3:.3f} ms with the probe; "
          f"ratio {m_on / m_off:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
