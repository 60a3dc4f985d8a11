"""Collective benchmark in the style of nccl-tests: all-reduce, all-gather, reduce-scatter and
send/recv over message sizes, on the job's backend (gloo over loopback on CPU, NCCL on GPUs).

Two ways to run it: ``run`` spawns local ranks (torch.multiprocessing), and
:class:`CalibrationRank` is one rank as a Ray actor, which ``orchestrator.runtime.calibrate``
places inside a node and across nodes per topology level.

    python -m workers.host.calibrate --nproc 2 --min-bytes 8 --max-bytes 16MiB --out rows.json

Each rank times `iters` calls per size after `warmup`; the slowest rank's median is the
row's time (a collective ends when its last rank does). Sizes double from --min-bytes (8 B, the
nccl-tests default) to --max-bytes; on this CPU machine the default cap is 16 MiB instead of
nccl-tests' 1 GiB (gloo over loopback on a shared 2-core box: 1 GiB all-reduces take seconds
each and add nothing to the fit, which is bandwidth-bound long before). Messages are fp32
tensors; for all-gather and reduce-scatter the size is the full (gathered) buffer, as
nccl-tests counts it. send/recv is a ping-pong between ranks 0 and 1 (half the round trip).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshyard.parallel import join_process_group
from orchestrator.planner.calibration.fit import PRIMITIVES, parse_size
from workers.host.env import free_port


def sizes(min_bytes: int, max_bytes: int, *, n: int) -> list[int]:
    """Doubling sizes, each a whole number of fp32 elements per rank (4 * n bytes)."""
    quantum = 4 * n
    out, s = [], max(min_bytes, 1)
    while s <= max_bytes:
        out.append(max(quantum, (s // quantum) * quantum))
        s *= 2
    return sorted(set(out))


def _one(primitive: str, nbytes: int, n: int, rank: int, device: torch.device) -> Any:
    """A closure making one call of `primitive` on preallocated buffers."""
    full = torch.ones(nbytes // 4, device=device)
    part = torch.ones(nbytes // 4 // n, device=device)
    if primitive == "all_reduce":
        return lambda: dist.all_reduce(full)
    if primitive == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part)
    if primitive == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)

    def ping_pong() -> None:
        if rank == 0:
            dist.send(full, 1)
            dist.recv(full, 1)
        elif rank == 1:
            dist.recv(full, 0)
            dist.send(full, 0)
    return ping_pong


def _time(fn: Any, *, warmup: int, iters: int, device: torch.device) -> float:
    """Median seconds per call on this rank, then the slowest rank's median: medians because
    a shared machine stalls single calls for milliseconds now and then. On CUDA each call is
    synchronised, so the time is the collective's, not the launch's."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    dist.barrier()
    took = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        took.append(time.perf_counter() - t0)
    med = torch.tensor([sorted(took)[len(took) // 2]], device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med.item())


def _iters(nbytes: int, base: int) -> int:
    return max(2, min(base, (64 << 20) // max(nbytes, 1)))  # fewer calls for big messages


def measure(rank: int, n: int, *, addr: str, port: int,
            cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Joins an n-rank group at addr:port, runs every primitive over every size and returns
    the rows (the same on every rank: times are reduced to the slowest rank's)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    backend = cfg.get("backend", "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    join_process_group(backend, addr, port, rank=rank, world_size=n,
                       timeout=timedelta(seconds=cfg.get("timeout_s", 300)), **kwargs)
    rows = []
    try:
        for prim in cfg["primitives"]:
            for nbytes in sizes(cfg["min_bytes"], cfg["max_bytes"], n=n):
                secs = _time(_one(prim, nbytes, n, rank, device), warmup=cfg["warmup"],
                             iters=_iters(nbytes, cfg["iters"]), device=device)
                if prim == "send_recv":
                    secs /= 2  # one way of the ping-pong
                rows.append({"primitive": prim, "n": 2 if prim == "send_recv" else n,
                             "bytes": nbytes, "seconds": secs})
    finally:
        dist.destroy_process_group()
    return rows


def _worker(rank: int, n: int, port: int, cfg: dict[str, Any]) -> None:
    rows = measure(rank, n, addr="127.0.0.1", port=port, cfg=cfg)
    if rank == 0:
        Path(cfg["out"]).write_text(json.dumps(rows))


class CalibrationRank:
    """One benchmark rank as a Ray actor (wrapped with ``ray.remote`` by the caller).

    NCCL when the actor sees a CUDA device (Ray sets CUDA_VISIBLE_DEVICES to the GPU it
    assigned), gloo otherwise: fake GPUs on a simulated cluster measure gloo over loopback.
    """

    def info(self) -> dict[str, Any]:
        import ray

        return {"ip": ray.util.get_node_ip_address(),
                "gpu_ids": [int(g) for g in ray.get_gpu_ids()],
                "cuda": torch.cuda.is_available()}

    def free_port(self) -> int:
        return free_port()

    def run(self, rank: int, n: int, addr: str, port: int,
            cfg: dict[str, Any]) -> list[dict[str, Any]]:
        if addr in ("127.0.0.1", "localhost"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        return measure(rank, n, addr=addr, port=port, cfg={**cfg, "backend": backend})


def run(*, nproc: int, out: Path, min_bytes: int = 8, max_bytes: int = 16 << 20,
        primitives: tuple[str, ...] = PRIMITIVES, warmup: int = 2, iters: int = 10,
        backend: str = "gloo") -> list[dict[str, Any]]:
    """Spawns `nproc` local ranks, runs the benchmark and returns rank 0's rows."""
    if nproc < 2:
        raise ValueError("a collective benchmark needs --nproc >= 2")
    bad = [p for p in primitives if p not in PRIMITIVES]
    if bad:
        raise ValueError(f"unknown primitives {bad}; use {PRIMITIVES}")
    cfg = {"backend": backend, "primitives": list(primitives), "min_bytes": min_bytes,
           "max_bytes": max_bytes, "warmup": warmup, "iters": iters, "out": str(out)}
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(nproc, free_port(), cfg), nprocs=nproc, join=True)
    return list(json.loads(Path(out).read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="workers.host.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="16MiB")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    rows = run(nproc=a.nproc, out=Path(a.out), min_bytes=parse_size(a.min_bytes),
               max_bytes=parse_size(a.max_bytes), iters=a.iters)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
