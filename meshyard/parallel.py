"""Data parallelism over a job's DeviceMesh: DDP, FSDP2 (ZeRO-2 / ZeRO-3) and HSDP.

torch only (nothing of meshyard's control plane): the one code path behind both the built-in
loop's `workers.loop.parallelize.parallelize` (after TP and activation checkpointing) and
`meshyard.train.torch.prepare_model` in a user's own rank process.

    kind = dp_kind(dp_replicate=2, dp_shard=4, zero_stage=3)          # "fsdp"
    model = apply_data_parallel(model, kind=kind, mesh=mesh, blocks=[...], device=device,
                                dp_replicate=2, dp_shard=4, tp=1, zero_stage=3)

* "fsdp" (ZeRO-2/3): `fully_shard` per block, then the root, over `mesh["dp_shard"]`, or the
  2D `mesh["dp_replicate", "dp_shard"]` (HSDP) when both degrees are > 1. ZeRO-2 keeps the
  parameters unsharded after forward (`reshard_after_forward=False`).
* "ddp" / "zero1": DDP over the replicate group (pure DDP), or over the flattened "dp" group
  (ZeRO-1, or DDP across dp_shard ranks).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from meshyard import _probe

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class UnsupportedLayoutError(ValueError):
    pass


def backend_for(device: torch.device) -> str:
    # On CUDA keep gloo for CPU tensors too: async checkpoint staging and small CPU
    # collectives need it.
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


# How long a rank other than 0 looks for rank 0's store before it leaves the rendezvous to
# torch (which then retries on its own back-off), and how often it looks.
STORE_WAIT_S = 5.0
_STORE_PROBE_S = 0.005


def wait_for_store(addr: str, port: int, *, rank: int, within_s: float = STORE_WAIT_S) -> bool:
    """On a rank other than 0: blocks until rank 0's rendezvous store accepts connections at
    `addr:port` (True) or `within_s` has passed (False). Rank 0 returns at once.

    torch's TCPStore client that finds nothing listening yet waits 0.3-0.4 s before it tries
    again, so ranks that start their rendezvous a few milliseconds before rank 0 does (each
    rank is its own actor: they never start together) would lose that much on every
    rendezvous; connecting here every 5 ms first makes torch's own connect succeed at once.
    The probe's connection carries nothing and closes at once."""
    if rank == 0:
        return True
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_STORE_PROBE_S)


def join_process_group(backend: str, addr: str, port: int, *, rank: int, world_size: int,
                       timeout: timedelta, **kwargs: Any) -> None:
    """Joins the default process group whose rank 0 serves the store at tcp://addr:port,
    once that store listens (`wait_for_store`); `kwargs` go to `init_process_group`. The
    groups' teardown is guarded from here on (meshyard/_probe.py, `guard_teardown`): a model
    freed right after `destroy_process_group` cannot hang the process."""
    wait_for_store(addr, port, rank=rank)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world_size, timeout=timeout, **kwargs)
    _probe.guard_teardown()


def local_device() -> torch.device:
    """cuda:LOCAL_RANK (among the visible GPUs) when CUDA is available, else cpu."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def ensure_process_group(timeout_s: float | None = None) -> torch.device:
    """The default process group from torchrun-style variables (env://), unless it exists or
    the world is one process. Returns this rank's device."""
    device = local_device()
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    timeout = timedelta(seconds=timeout_s or float(os.environ.get(
        "MESHYARD_INIT_TIMEOUT_S", "600")))
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        wait_for_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                       rank=int(os.environ.get("RANK", "0")))
    dist.init_process_group(backend=backend_for(device), init_method="env://", timeout=timeout,
                            **kwargs)
    _probe.guard_teardown()  # as in join_process_group
    return device


def init_mesh(device_type: str, shape: Sequence[int], names: Sequence[str]) -> DeviceMesh:
    """DeviceMesh with the given dims, plus a flattened "dp" over dp_replicate x dp_shard
    when both exist. Needs the default process group (or world size 1)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))
    if "dp_replicate" in names and "dp_shard" in names:
        mesh["dp_replicate", "dp_shard"]._flatten("dp")
    return mesh


def dp_kind(*, dp_replicate: int, dp_shard: int, zero_stage: int) -> str:
    """Which wrapper applies: "none", "ddp", "zero1" or "fsdp" (ZeRO-2/3)."""
    if dp_replicate * dp_shard == 1:
        return "none"
    if zero_stage in (2, 3):
        return "fsdp"
    return "zero1" if zero_stage == 1 else "ddp"


def default_blocks(module: nn.Module) -> list[nn.Module]:
    """The children of the model's block containers (top-level ModuleList / ModuleDict
    attributes: `layers`, `blocks`, `h`, ...): the units FSDP shards one by one."""
    out: list[nn.Module] = []
    for child in module.children():
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            out.extend(child.children())
    return out


def apply_fsdp(module: nn.Module, *, blocks: Sequence[nn.Module], mesh: DeviceMesh,
               reshard_after_forward: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    # The root holds embedding / norm / head; it never reshards after forward because
    # backward starts with the head.
    fully_shard(module, mesh=mesh, reshard_after_forward=False)


def apply_ddp(module: nn.Module, *, group: Any, device: torch.device,
              bucket_cap_mb: float = 25.0) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(module, process_group=group, bucket_cap_mb=bucket_cap_mb,
               device_ids=[device.index] if device.type == "cuda" else None)


def apply_data_parallel(module: nn.Module, *, kind: str, mesh: DeviceMesh | None,
                        blocks: Sequence[nn.Module], device: torch.device, dp_replicate: int,
                        dp_shard: int, tp: int, zero_stage: int,
                        bucket_cap_mb: float = 25.0) -> nn.Module:
    """Wraps `module` (already on `device`, TP already applied) for data parallelism.
    Returns the module to train: a DDP wrapper, or `module` itself sharded in place."""
    if kind == "none":
        return module
    assert mesh is not None
    if kind == "fsdp":
        sub = mesh["dp_replicate", "dp_shard"] if dp_replicate > 1 else mesh["dp_shard"]
        apply_fsdp(module, blocks=blocks, mesh=sub, reshard_after_forward=zero_stage == 3)
        return module
    if tp > 1:
        raise UnsupportedLayoutError(
            "DDP / ZeRO-1 with tp > 1 is not supported; shard data parallelism with dp_shard "
            "(FSDP, zero_stage 2/3) when combining it with TP")
    return apply_ddp(module, group=ddp_group(mesh, kind=kind, dp_shard=dp_shard),
                     device=device, bucket_cap_mb=bucket_cap_mb)


def ddp_group(mesh: DeviceMesh, *, kind: str, dp_shard: int) -> Any:
    """The group DDP reduces over: the flattened "dp" (ZeRO-1, or DDP across dp_shard
    ranks), else the replicate dimension."""
    return mesh.get_group("dp") if kind == "zero1" or dp_shard > 1 \
        else mesh.get_group("dp_replicate")
