"""Pipeline parallelism: split the built-in GPT into stages and drive a torch pipelining schedule.

Stage layout. With ``pp`` ranks and ``v`` virtual stages per rank there are ``pp * v`` stages,
each holding ``n_layers / (pp * v)`` consecutive blocks; the first stage also holds the
embeddings, the last the final norm and the LM head (the loss is computed there). Rank ``r``
of the pp group holds stages ``r, r + pp, r + 2 * pp, ...`` (the "loop" order
``ScheduleInterleaved1F1B`` expects). Example, pp=2, v=2, 8 layers::

    stage 0 (rank 0): embeddings + blocks 0-1     stage 1 (rank 1): blocks 2-3
    stage 2 (rank 0): blocks 4-5                  stage 3 (rank 1): blocks 6-7 + norm + head

Every rank builds the whole model with the job's seed first and keeps only its stages' parts,
so the parameters are bit-identical to the single-process reference.

Batches. One optimizer step runs one schedule step over the data-parallel rank's whole batch
(``grad_accum_steps`` micro-batches concatenated), cut into
``pp_microbatches * grad_accum_steps`` pipeline microbatches of equal size. The loss is a mean
per microbatch and the schedule divides gradients by the microbatch count, so the gradient is the
mean over the batch, as in the reference. Data parallelism (DDP over dp_replicate, FSDP2 over
dp_shard, HSDP over both) wraps each stage module; torch's stage code disables gradient sync
for all but the last microbatch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from orchestrator.spec import JobSpec, PPSchedule

# The built-in GPT's parts, by attribute name; a stage keeps the same names so that parameter
# FQNs (and so distributed checkpoints) match the unsplit model.
EMBED_ATTRS = ("tok_emb", "pos_emb", "drop")
HEAD_ATTRS = ("ln_f", "head")
BLOCKS_ATTR = "blocks"


@dataclass(frozen=True)
class StageLayout:
    """Which stages a pp rank holds and which blocks each stage holds.

    >>> StageLayout.build(n_layers=8, pp=2, virtual=2, pp_rank=1).stage_ids
    (1, 3)
    >>> StageLayout.build(n_layers=8, pp=2, virtual=2, pp_rank=1).layers(3)
    range(6, 8)
    """

    n_layers: int
    num_stages: int
    stage_ids: tuple[int, ...]

    @classmethod
    def build(cls, *, n_layers: int, pp: int, virtual: int, pp_rank: int) -> StageLayout:
        num_stages = pp * virtual
        if n_layers % num_stages:
            raise ValueError(f"{num_stages} pipeline stages do not divide n_layers={n_layers}")
        ids = tuple(pp_rank + k * pp for k in range(virtual))
        return cls(n_layers=n_layers, num_stages=num_stages, stage_ids=ids)

    def layers(self, stage_id: int) -> range:
        per = self.n_layers // self.num_stages
        return range(stage_id * per, (stage_id + 1) * per)


class GPTStage(nn.Module):
    """A contiguous slice of the built-in GPT: optional embeddings, some blocks, optional head.

    Block keys are the original layer indices ("4", "5"), so ``blocks.4.attn...`` names the
    same parameter here and in the whole model.
    """

    def __init__(self, model: nn.Module, *, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        for name in EMBED_ATTRS if first else ():
            if hasattr(model, name):
                setattr(self, name, getattr(model, name))
        blocks = getattr(model, BLOCKS_ATTR)
        self.blocks = nn.ModuleDict({str(i): blocks[i] for i in layers})
        for name in HEAD_ATTRS if last else ():
            setattr(self, name, getattr(model, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)
            if hasattr(self, "drop"):
                x = self.drop(x)
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


def split_model(model: nn.Module, layout: StageLayout) -> list[GPTStage]:
    """The stage modules this rank holds, sharing parameters with ``model``."""
    last = layout.num_stages - 1
    return [
        GPTStage(model, layers=layout.layers(s), first=s == 0, last=s == last)
        for s in layout.stage_ids
    ]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _dim_size(mesh: DeviceMesh, name: str) -> int:
    names = mesh.mesh_dim_names or ()
    return mesh[name].size() if name in names else 1


def wrap_data_parallel(module: nn.Module, *, mesh: DeviceMesh, spec: JobSpec) -> nn.Module:
    """DDP over dp_replicate, FSDP2 over dp_shard, HSDP over both; identity without DP.

    FSDP shards each block, then the stage root, as torchtitan does; the whole-stage group then
    holds only the embeddings / head. Parameters stay unsharded after forward because every
    microbatch's backward needs them again (resharding would all-gather once per microbatch).
    """
    rep, shard = _dim_size(mesh, "dp_replicate"), _dim_size(mesh, "dp_shard")
    if shard > 1:
        from torch.distributed.fsdp import fully_shard

        dp_mesh = mesh["dp_replicate", "dp_shard"] if rep > 1 else mesh["dp_shard"]
        for block in module.blocks.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=False)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=False)
        return module
    if rep > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(
            module,
            process_group=mesh["dp_replicate"].get_group(),
            bucket_cap_mb=spec.training.ddp.bucket_cap_mb,
        )
    return module


def pp_clip_grad_norm_(
    params: Iterable[nn.Parameter], *, max_norm: float | None, pp_group: dist.ProcessGroup | None
) -> float:
    """Global grad norm over every pipeline stage (and DTensor shard); clips when max_norm is set.

    Each stage sees only its own parameters, so the squared local norms are summed over the pp
    group before clipping: the result equals ``clip_grad_norm_`` on the whole model.
    """
    grads_params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in grads_params]
    if not grads:
        local = torch.zeros(())
    else:
        local = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if hasattr(local, "full_tensor"):
        local = local.full_tensor()
    sq = local.detach().float() ** 2
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(sq, group=pp_group)
    total = sq.sqrt()
    if max_norm is not None and grads_params:
        torch.nn.utils.clip_grads_with_norm_(grads_params, max_norm, total.to(grads[0].device))
    return float(total)


_SCHEDULES = {
    PPSchedule.GPIPE: ScheduleGPipe,
    PPSchedule.ONE_F_ONE_B: Schedule1F1B,
    PPSchedule.INTERLEAVED_1F1B: ScheduleInterleaved1F1B,
}


class PipelineRunner:
    """One rank's share of the pipeline: its stage modules, their PipelineStages, the schedule.

    ``train_step`` runs forward, backward and the loss for a data-parallel rank's batch and
    returns the global mean loss (the same value on every rank). The caller owns the optimizer
    (built over ``parameters()``), clipping via ``clip_grad_norm_`` and ``zero_grad``.
    """

    def __init__(
        self,
        *,
        modules: Sequence[nn.Module],
        stages: Sequence[PipelineStage],
        schedule: ScheduleGPipe | Schedule1F1B | ScheduleInterleaved1F1B,
        pp_group: dist.ProcessGroup | None,
        dp_size: int,
    ) -> None:
        self.modules = list(modules)
        self.stages = list(stages)
        self.schedule = schedule
        self.pp_group = pp_group
        self.dp_size = dp_size
        self.is_first = any(s.is_first for s in self.stages)
        self.is_last = any(s.is_last for s in self.stages)
        self.stalled = False

    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.modules for p in m.parameters()]

    def train(self, mode: bool = True) -> None:
        for m in self.modules:
            m.train(mode)

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward + backward of one global step; returns the mean loss over the global batch."""
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()
        self.schedule.step(
            *args, target=targets if self.is_last else None, losses=losses, return_outputs=False
        )
        mine = torch.stack([l.detach().float() for l in losses]).mean() if losses else None
        return self._global_loss(mine, device=inputs.device)

    def _global_loss(self, mine: torch.Tensor | None, *, device: torch.device) -> torch.Tensor:
        # Only last-stage ranks hold a loss; one all-reduce over the world both moves it to
        # rank 0 (first stage, which writes metrics) and averages it over data parallelism.
        loss = torch.zeros((), device=device) if mine is None else mine.to(device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(loss)
        return loss / self.dp_size

    def clip_grad_norm_(self, max_norm: float | None) -> float:
        return pp_clip_grad_norm_(self.parameters(), max_norm=max_norm, pp_group=self.pp_group)

    def stall_sends(self) -> None:
        """Fault ``p2p_stall``: from now on this rank's stages never send activations or grads.

        The peers block in their receives until the process group's timeout fires, and so does
        this rank once it waits for what it is owed: a real pipeline stall, no exception raised.
        """
        for stage in self.stages:
            stage.get_fwd_send_ops = _no_sends  # type: ignore[method-assign]
            stage.get_bwd_send_ops = _no_sends  # type: ignore[method-assign]
        self.stalled = True


def _no_sends(_chunk_id: int) -> list[dist.P2POp]:
    return []


def build_pipeline(
    model: nn.Module,
    *,
    spec: JobSpec,
    mesh: DeviceMesh,
    device: torch.device,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss,
) -> PipelineRunner:
    """Splits ``model`` for this rank's pp coordinate and builds the stages and schedule.

    ``wrap`` applies TP / data parallelism to each stage module (default:
    :func:`wrap_data_parallel`). ``mesh`` must have a "pp" dimension.
    """
    par = spec.parallelism
    pp_mesh = mesh["pp"]
    pp_rank = pp_mesh.get_local_rank()
    layout = StageLayout.build(
        n_layers=len(getattr(model, BLOCKS_ATTR)), pp=par.pp, virtual=par.pp_virtual_stages,
        pp_rank=pp_rank,
    )
    wrap = wrap or (lambda m: wrap_data_parallel(m, mesh=mesh, spec=spec))
    modules = [wrap(m.to(device)) for m in split_model(model, layout)]
    group = pp_mesh.get_group()
    stages = [
        PipelineStage(m, sid, layout.num_stages, device, group=group)
        for m, sid in zip(modules, layout.stage_ids, strict=True)
    ]
    n_micro = par.pp_microbatches * spec.training.grad_accum_steps
    cls = _SCHEDULES[par.pp_schedule]
    schedule = cls(stages if cls is ScheduleInterleaved1F1B else stages[0], n_micro,
                   loss_fn=loss_fn, scale_grads=True)
    return PipelineRunner(modules=modules, stages=stages, schedule=schedule,
                          pp_group=group, dp_size=par.dp)


def local_batch_tokens(spec: JobSpec) -> int:
    """Tokens one data-parallel rank processes per optimizer step (for tokens/s)."""
    t = spec.training
    return t.micro_batch_size * t.grad_accum_steps * spec.model.seq_len


__all__ = [
    "GPTStage",
    "PipelineRunner",
    "StageLayout",
    "build_pipeline",
    "lm_loss",
    "local_batch_tokens",
    "pp_clip_grad_norm_",
    "split_model",
    "wrap_data_parallel",
]
