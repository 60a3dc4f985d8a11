"""Process setup: rank environment, debug environment, device, process group, timeouts.

Two entry points for launchers:

* :func:`worker_env` returns the environment dict one rank needs (RANK, LOCAL_RANK,
  WORLD_SIZE, MASTER_ADDR/PORT plus NCCL_DEBUG and Flight Recorder variables). The Ray runtime
  applies it in each worker actor before calling ``run_training``; torchrun sets the rank
  variables itself and the launcher adds :func:`debug_env`.
* :func:`init_distributed` creates the default process group (NCCL on CUDA — with gloo for CPU
  tensors — gloo otherwise) with the spec's long init timeout. After the first step the loop
  calls :func:`set_collective_timeout` with the shorter steady-state timeout.

Flight Recorder variables must be in ``os.environ`` before the process group exists (they
are read when the first group is built), so :func:`apply_env` runs first.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.spec import Device, JobSpec
from workers.host.assignment import DistEnv

if TYPE_CHECKING:
    import torch


# Ray's default worker ports end at 19999; the kernel's ephemeral ports (what a port-0 bind or
# an outgoing connection gets) start at the first number of ip_local_port_range.
_PORTS_FROM = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", *, tries: int = 64) -> int:
    """A TCP port free on `host` now (MASTER_PORT of a rendezvous; tests' torchrun ports).

    Rank 0 binds it a moment later, so it is drawn at random below the kernel's ephemeral
    range: a port the kernel hands out (another process's port-0 bind, any outgoing
    connection) cannot take it in between. Where that range leaves no room, or `tries`
    random ports are all taken, the kernel picks one."""
    top = _ephemeral_start() - 1
    if top - _PORTS_FROM >= 1000:
        for port in random.sample(range(_PORTS_FROM, top + 1), tries):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def debug_env(spec: JobSpec, *, run_dir: str | Path) -> dict[str, str]:
    """NCCL_DEBUG and Flight Recorder settings; dump files go under ``run_dir``.

    >>> e = debug_env(parse_spec({"name": "x"}), run_dir="/runs/a")   # doctest: +SKIP
    >>> e["NCCL_DEBUG_FILE"], e["TORCH_FR_BUFFER_SIZE"]
    ('/runs/a/nccl/%h.%p.log', '2000')
    """
    run = Path(run_dir).resolve()
    d = spec.debug
    fr_size = str(d.flight_recorder_entries)
    fr_prefix = str(run / "flight_recorder" / "rank_")  # torch appends the global rank
    return {
        "NCCL_DEBUG": d.nccl_debug,
        "NCCL_DEBUG_SUBSYS": d.nccl_debug_subsys,
        "NCCL_DEBUG_FILE": str(run / "nccl" / "%h.%p.log"),
        # TORCH_FR_* are the current names for every backend; torch >= 2.8 warns on the old
        # TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE, so only these are set.
        "TORCH_FR_BUFFER_SIZE": fr_size,
        "TORCH_FR_DUMP_TEMP_FILE": fr_prefix,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
    }


def worker_env(
    spec: JobSpec,
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    run_dir: str | Path,
) -> dict[str, str]:
    """Everything one rank's process needs in its environment (the Ray runtime's entry point)."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "MESHYARD_RUN_DIR": str(Path(run_dir).resolve()),
    }
    env.update(debug_env(spec, run_dir=run_dir))
    return env


def apply_env(env: Mapping[str, str], *, run_dir: str | Path | None = None) -> None:
    """Sets ``env`` into os.environ and creates the dump directories it points at."""
    os.environ.update(env)
    if run_dir is not None:
        for sub in ("nccl", "flight_recorder"):
            (Path(run_dir) / sub).mkdir(parents=True, exist_ok=True)


def select_device(spec: JobSpec, *, local_rank: int) -> torch.device:
    """cpu / cuda per the spec; with CUDA, the GPU is LOCAL_RANK among the visible ones.

    Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned, so an actor with one GPU sees
    exactly one device (index 0) whatever its LOCAL_RANK.
    """
    import torch  # here, not at module level: a user-code worker needs only the env helpers

    want = spec.resources.device
    has_cuda = torch.cuda.is_available()
    if want == Device.CUDA and not has_cuda:
        raise RuntimeError("resources.device is cuda but this worker sees no CUDA device; "
                           "check the node's GPUs or set device: cpu")
    if want == Device.CPU or not has_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = 0 if count == 1 else local_rank % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_distributed(spec: JobSpec, *, dist_env: DistEnv, device: torch.device) -> bool:
    """Creates the default process group unless it exists or the world is one process.

    Returns True when this call created it (the caller then owns its destruction).
    """
    import torch.distributed as dist

    from meshyard.parallel import backend_for, join_process_group

    if dist_env.world_size == 1 or dist.is_initialized():
        return False
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    join_process_group(backend_for(device), dist_env.master_addr, dist_env.master_port,
                       rank=dist_env.rank, world_size=dist_env.world_size,
                       timeout=timedelta(seconds=spec.fault_tolerance.init_timeout_s), **kwargs)
    return True


def set_collective_timeout(seconds: float) -> None:
    """Sets the timeout of every existing process group (default and sub-groups).

    Sub-groups (the mesh dimensions) copy the init timeout when created, so they are all
    updated, not only the default group.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    td = timedelta(seconds=seconds)
    for pg in list(c10d._world.pg_map.keys()):
        try:
            c10d._set_pg_timeout(td, pg)
        except ValueError:  # a group this rank is not a member of
            continue
