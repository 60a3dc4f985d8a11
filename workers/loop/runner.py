"""StepRunner: the strategy that turns one step's micro-batches into gradients.

The loop is the same for every parallelism; only this part differs:

* :class:`LocalStepRunner` (no pipeline): forward + backward per micro-batch with gradient
  accumulation, DDP / FSDP gradient sync only on the last micro-batch.
* ``workers.loop.pipeline.build_pipeline_runner(ctx)`` (pp > 1): a ``torch.distributed.pipelining``
  schedule over this rank's model chunk(s). It receives a :class:`BuildContext`, splits
  ``ctx.built.module`` into its stage chunk(s), calls ``ctx.parallelize_chunk`` on each
  (TP -> AC -> FSDP/DDP over the non-pp dims) and returns an object satisfying
  :class:`StepRunner`.

Contract for ``train_step``: run forward and backward over ``microbatches`` (one entry per
gradient-accumulation step, each ``micro_batch_size`` sequences of this rank's data shard),
leave the *averaged* gradients (mean over every sequence of the global batch) in the
parameters of ``model_parts``, do NOT step the optimizer, and return the mean loss over this
rank's micro-batches as a detached scalar tensor — or None on ranks that compute no loss
(non-last pipeline stages). Call ``progress.enter(Phase.FORWARD / BACKWARD)`` as phases change.
``clip_grad_norm`` returns the norm over the whole model (every stage) and clips.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workers.loop.callbacks import Phase
from workers.loop.grads import clip_grad_norm
from workers.loop.heartbeat import Progress
from workers.loop.model import loss_fn
from workers.loop.moe import aux_loss_term, moe_layers
from workers.loop.step_contract import Batch, BuildContext, StepRunner

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh



class LocalStepRunner:
    """Gradient accumulation over micro-batches on a whole (possibly DP/TP-wrapped) model."""

    def __init__(self, model: nn.Module, *,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_fn,
                 expert_group: Any = None, cp_mesh: DeviceMesh | None = None) -> None:
        self._model = model
        self._loss = loss
        # Context parallel: each micro-batch's forward and backward run inside torch's
        # context_parallel over this mesh, with the tokens, targets and the embedding's
        # position ids sharded along the sequence.
        self._cp_mesh = cp_mesh
        # Expert parallel: the experts differ per rank of this group (their norms add up).
        self._expert_group = expert_group
        self._experts: set[nn.Parameter] = set()
        self._moe = moe_layers(model)  # their load-balancing loss joins the objective
        if expert_group is not None:
            self._experts = {p for m in self._moe for p in m.experts.parameters()}

    @property
    def model_parts(self) -> list[nn.Module]:
        return [self._model]

    def _sync_ctx(self, last: bool) -> contextlib.AbstractContextManager[None]:
        # Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch.
        set_sync = getattr(self._model, "set_requires_gradient_sync", None)  # FSDP2
        if set_sync is not None:
            set_sync(last)
            return contextlib.nullcontext()
        no_sync = getattr(self._model, "no_sync", None)  # DDP
        if not last and no_sync is not None:
            ctx: contextlib.AbstractContextManager[None] = no_sync()
            return ctx
        return contextlib.nullcontext()

    def train_step(self, microbatches: Sequence[Batch], *, step: int,
                   progress: Progress) -> torch.Tensor | None:
        n = len(microbatches)
        total = torch.zeros((), device=microbatches[0].inputs.device)
        for i, mb in enumerate(microbatches):
            if self._cp_mesh is not None:
                mb = Batch(inputs=mb.inputs.clone(), targets=mb.targets.clone())
            with self._sync_ctx(i == n - 1), self._cp_ctx(mb):
                progress.enter(Phase.FORWARD)
                loss = self._loss(self._model(mb.inputs), mb.targets)
                aux = aux_loss_term(self._moe)
                progress.enter(Phase.BACKWARD)
                ((loss if aux is None else loss + aux) / n).backward()
            total += loss.detach()
        return total / n

    def _cp_ctx(self, mb: Batch) -> contextlib.AbstractContextManager[None]:
        if self._cp_mesh is None:
            return contextlib.nullcontext()
        from torch.distributed.tensor.experimental import context_parallel

        buffers = [mb.inputs, mb.targets]
        dims = [1, 1]
        embed = getattr(self._model, "embed", None)
        if embed is not None and hasattr(embed, "shard_positions"):
            buffers.append(embed.shard_positions())
            dims.append(0)
        return context_parallel(self._cp_mesh, buffers=buffers, buffer_seq_dims=dims,
                                no_restore_buffers={mb.inputs, mb.targets})

    def clip_grad_norm(self, max_norm: float | None) -> float:
        return clip_grad_norm(self._model.parameters(), max_norm, split=self._experts,
                              split_group=self._expert_group)


def build_runner(ctx: BuildContext) -> StepRunner:
    """Picks the strategy: the pipeline runner when pp > 1, else the local one."""
    if ctx.dims.pp > 1:
        from workers.loop.pipeline import build_pipeline_runner  # torch.distributed.pipelining

        runner: StepRunner = build_pipeline_runner(ctx)
        return runner
    expert_group = ctx.mesh["ep"].get_group() if ctx.dims.ep > 1 and ctx.mesh is not None \
        else None
    cp_mesh = ctx.mesh["cp"] if ctx.dims.cp > 1 and ctx.mesh is not None else None
    return LocalStepRunner(ctx.parallelize_chunk(ctx.built.module), loss=ctx.loss_fn,
                           expert_group=expert_group, cp_mesh=cp_mesh)
