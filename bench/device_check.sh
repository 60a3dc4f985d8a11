#!/usr/bin/env bash
# One short script for the GPU device machine: the topology capture and its parse, the
# CUDA/NCCL path at world size 1 with NCCL_DEBUG=INFO and a Flight Recorder dump, then the GPU
# tests where the machine's Python has the project's dependencies.
#
# The device machine reaches no package index: it runs the machine's own python3 (the one
# with PyTorch) on this checkout (PYTHONPATH), installing nothing. The topology parser and
# the NCCL check need only PyTorch; tests/gpu need the project's dependencies (pydantic, Ray,
# ...) and are skipped with the reason when they cannot be imported.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/meshyard-device}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi topo -m | tee "$OUT/topo_m.txt"
"$PY" - "$OUT/topo_m.txt" <<'PY' 2>&1 | tee "$OUT/topo_parse.txt"
import sys
from orchestrator.topology.nvidia_smi import parse_topo_matrix
topo = parse_topo_matrix(open(sys.argv[1]).read())
print("parsed:", len(topo.gpus), "GPU(s),", len(topo.nics), "NIC(s),", len(topo.links), "GPU links")
PY
NCCL_DEBUG=INFO TORCH_FR_BUFFER_SIZE=2000 "$PY" - <<'PY' 2>&1 | tee "$OUT/fr_dump.txt"
import os, pickle, time, torch, torch.distributed as dist
print("torch", torch.__version__, torch.cuda.get_device_name(0))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
for wait in (0.0, 3.0):  # the dump at once, and after c10d's watchdog had time to look
    time.sleep(wait)
    d = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())
    print(f"after {wait:g} s: entries", len(d["entries"]),
          [e["profiling_name"] for e in d["entries"]][:3], "pg_status", d.get("pg_status"))
dist.destroy_process_group()
PY
if "$PY" -c "import pydantic, ray, sqlalchemy, fastapi" 2>"$OUT/deps.txt"; then
    NCCL_DEBUG=INFO "$PY" -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/pytest_gpu.txt"
else
    echo "tests/gpu skipped: this python lacks the project's dependencies ($(tail -1 "$OUT/deps.txt"))" \
        | tee "$OUT/pytest_gpu.txt"
fi
