#!/usr/bin/env bash
# One short script for the GPU device machine: CUDA/NCCL path at world size 1, NCCL_DEBUG=INFO,
# a Flight Recorder dump, and a few steps of each parallelism that fits one GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/meshyard-device}"; mkdir -p "$OUT"
python3 -m venv /tmp/dv && /tmp/dv/bin/pip install -q -e ".[dev]" >"$OUT/pip.log" 2>&1
nvidia-smi topo -m | tee "$OUT/topo_m.txt"
/tmp/dv/bin/meshyard topo parse "$OUT/topo_m.txt" --json > "$OUT/topo.json"
NCCL_DEBUG=INFO TORCH_FR_BUFFER_SIZE=2000 /tmp/dv/bin/python -m pytest -q tests/gpu 2>&1 | tee "$OUT/pytest_gpu.txt"
/tmp/dv/bin/python - <<'PY' 2>&1 | tee "$OUT/fr_dump.txt"
import os, pickle, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555", TORCH_NCCL_TRACE_BUFFER_SIZE="2000")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
d = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())
print("entries", len(d["entries"]), [e["profiling_name"] for e in d["entries"]][:3])
print("pg_status", d.get("pg_status"))
dist.destroy_process_group()
PY
