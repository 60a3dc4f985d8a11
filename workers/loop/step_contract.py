"""What a step runner is given and what it promises (workers/loop/runner.py for the local
runner, workers/loop/pipeline.py for pipeline stages): a micro-batch, the build context, and
the `StepRunner` protocol the loop drives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from workers.loop.heartbeat import Progress
from workers.loop.model import BuiltModel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from orchestrator.mesh import MeshShape
    from orchestrator.spec import JobSpec
    from workers.host.faults import FaultInjector


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor   # (micro_batch, seq_len) token ids
    targets: torch.Tensor  # (micro_batch, seq_len) next-token ids


class StepRunner(Protocol):
    @property
    def model_parts(self) -> list[nn.Module]: ...

    def train_step(self, microbatches: Sequence[Batch], *, step: int,
                   progress: Progress) -> torch.Tensor | None: ...

    def clip_grad_norm(self, max_norm: float | None) -> float:
        """Total L2 norm of the whole model's gradients (identical on every rank); scales
        them to ``max_norm`` when set. The pipeline runner adds the stages' norms over pp."""
        ...


@dataclass(frozen=True)
class BuildContext:
    """Everything a runner builder needs. ``mesh`` is None for a single process."""

    spec: JobSpec
    built: BuiltModel
    dims: MeshShape
    mesh: DeviceMesh | None
    device: torch.device
    rank: int
    faults: FaultInjector
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # Applies TP -> activation checkpointing -> FSDP/DDP to one module (a whole model or one
    # pipeline chunk) and moves it to the device. See workers.loop.parallelize.parallelize.
    parallelize_chunk: Callable[[nn.Module], nn.Module]
