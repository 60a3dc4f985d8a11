"""Ray Train's `ray.train.torch` on meshyard: the job's data parallelism applied by the same
code as the built-in loop's (`meshyard.parallel`), distributed data loading, and the driver's
`TorchTrainer` (meshyard/train/_trainer.py), which runs the training function as a job.

    model = meshyard.train.torch.prepare_model(model)          # DDP, or FSDP2 / HSDP
    loader = meshyard.train.torch.prepare_data_loader(loader)  # sharded over DP, on device
    result = meshyard.train.torch.TorchTrainer(train_func, scaling_config=...).fit()
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from meshyard import _protocol as proto
from meshyard import parallel
from meshyard.train._context import get_context
from meshyard.train._trainer import DataParallelTrainer


class TorchTrainer(DataParallelTrainer):
    """Ray Train's TorchTrainer: `fit()` runs `train_loop_per_worker(train_loop_config)` in
    every rank of a meshyard job, the default process group already made (gloo on CPU,
    NCCL on GPU). `torch_config` is accepted for its `backend` / `timeout_s` and otherwise
    left to the job's settings."""

    def __init__(self, train_loop_per_worker: Any, *, torch_config: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(train_loop_per_worker, **kwargs)
        self.torch_config = torch_config


class TorchConfig:
    """Accepted for Ray Train compatibility: meshyard picks the backend (gloo on CPU, NCCL on
    GPU) and the timeouts come from the job's `fault_tolerance`."""

    def __init__(self, backend: str | None = None, init_method: str = "env",
                 timeout_s: int = 1800) -> None:
        self.backend, self.init_method, self.timeout_s = backend, init_method, timeout_s


def get_device() -> torch.device:
    """This rank's device: cuda:LOCAL_RANK among the job's GPUs on the node, else cpu."""
    return parallel.local_device()


def prepare_model(model: nn.Module, *, blocks: Sequence[nn.Module] | None = None,
                  bucket_cap_mb: float = 25.0) -> nn.Module:
    """Moves `model` to this rank's device and applies the job's data parallelism: DDP over
    the data-parallel ranks, or FSDP2 (HSDP with dp_replicate > 1) when the job's dp_shard
    is > 1 (ZeRO-3, or ZeRO-2 with `parallelism.zero_stage: 2`). FSDP shards each of
    `blocks` (default: the children of the model's ModuleList / ModuleDict attributes), then
    the root. Creates the default process group if the code has not."""
    device = parallel.ensure_process_group()
    model = model.to(device)
    ctx = get_context()
    m = ctx.get_mesh_shape()
    dp_replicate, dp_shard, tp = m.get("dp_replicate", 1), m.get("dp_shard", 1), m.get("tp", 1)
    zero = int(os.environ.get(proto.ZERO_STAGE, "3" if dp_shard > 1 else "0"))
    kind = parallel.dp_kind(dp_replicate=dp_replicate, dp_shard=dp_shard, zero_stage=zero)
    if kind == "none":
        return model
    return parallel.apply_data_parallel(
        model, kind=kind, mesh=ctx.get_device_mesh(), device=device,
        blocks=list(blocks) if blocks is not None else parallel.default_blocks(model),
        dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, zero_stage=zero,
        bucket_cap_mb=bucket_cap_mb)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


class _DeviceLoader:
    """Iterates a DataLoader, moving each batch to the device; `sampler` is the distributed
    one (call `loader.sampler.set_epoch(epoch)` each epoch, as with Ray Train)."""

    def __init__(self, loader: DataLoader[Any], device: torch.device) -> None:
        self._loader, self._device = loader, device
        self.sampler = loader.sampler
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield _to_device(batch, self._device)


def prepare_data_loader(loader: DataLoader[Any], *, move_to_device: bool = True) -> Any:
    """A copy of `loader` whose sampler hands each rank its data shard (`ctx.get_dp_rank()` of
    `ctx.get_dp_size()`: TP, CP and pipeline peers read the same one), shuffling when the
    original did; batches moved to the device."""
    ctx = get_context()
    if ctx.get_dp_size() > 1 and not isinstance(loader.sampler, DistributedSampler):
        sampler: DistributedSampler[Any] = DistributedSampler(
            loader.dataset, num_replicas=ctx.get_dp_size(), rank=ctx.get_dp_rank(),
            shuffle=isinstance(loader.sampler, RandomSampler), drop_last=loader.drop_last)
        loader = DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                            num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                            pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                            generator=loader.generator)
    return _DeviceLoader(loader, get_device()) if move_to_device else loader
