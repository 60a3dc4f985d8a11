"""Pipeline parallelism: split the model into stages and drive a torch pipelining schedule.

Stage layout. With ``pp`` ranks and ``v`` virtual stages per rank there are ``pp * v`` stages,
each holding ``n_layers / (pp * v)`` consecutive blocks; the first stage also holds the
embedding, the last the final norm and the LM head (the loss is computed there). Rank ``r`` of
the pp group holds stages ``r, r + pp, r + 2 * pp, ...`` (the "loop" order
``ScheduleInterleaved1F1B`` expects). Example, pp=2, v=2, 8 layers::

    stage 0 (pp rank 0): embed + layers 0-1      stage 1 (pp rank 1): layers 2-3
    stage 2 (pp rank 0): layers 4-5              stage 3 (pp rank 1): layers 6-7 + norm + head

A stage module is a deep copy of the whole seeded model with the other stages' layers deleted
and the missing ends set to None (the GPT's forward skips them), so parameter names (FQNs) and
values equal the unsplit model's: parity with the single-process reference, and checkpoints
that reshard across layouts.

Batches. One optimizer step is one schedule step over the data-parallel rank's whole batch
(the ``grad_accum_steps`` micro-batches concatenated), cut into
``pp_microbatches * grad_accum_steps`` pipeline microbatches of equal size. The loss is a mean
per microbatch and the schedule divides the gradients by the microbatch count, so they are the
batch mean, as in the reference. Each stage module goes through the core's ``parallelize``
(TP -> activation checkpointing -> FSDP, or ``replicate`` at ZeRO-0, over the non-pp mesh
dims); torch's stage code turns gradient sync off for all but the last microbatch of an FSDP
module (``replicate`` makes one too).

Gradient clipping needs the norm over the whole model, so :meth:`PipelineRunner.clip_grad_norm`
adds the squared stage norms over the pp group before clipping.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining import schedules as _schedules
from torch.distributed.tensor import DTensor

from orchestrator.spec import FaultKind, PPSchedule
from workers.loop.callbacks import Phase
from workers.loop.heartbeat import Progress

if TYPE_CHECKING:
    from workers.host.faults import FaultInjector
    from workers.loop.step_contract import Batch, BuildContext

# The layout a splittable model has (the built-in GPT's): ends that may be None, and blocks
# in a ModuleDict keyed by their layer index.
EMBED, LAYERS, NORM, HEAD = "embed", "layers", "norm", "lm_head"


class PipelineLayoutError(ValueError):
    """A model or spec that cannot be pipelined, with the fix in the message."""


@dataclass(frozen=True)
class StageLayout:
    """Which stages one pp rank holds and which layers each stage holds.

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
            raise PipelineLayoutError(f"{num_stages} pipeline stages (pp={pp} x "
                                      f"pp_virtual_stages={virtual}) do not divide the "
                                      f"model's {n_layers} layers")
        ids = tuple(pp_rank + k * pp for k in range(virtual))
        return cls(n_layers=n_layers, num_stages=num_stages, stage_ids=ids)

    def layers(self, stage_id: int) -> range:
        per = self.n_layers // self.num_stages
        return range(stage_id * per, (stage_id + 1) * per)


def check_splittable(model: nn.Module) -> None:
    missing = [a for a in (EMBED, NORM, HEAD) if not hasattr(model, a)]
    layers = getattr(model, LAYERS, None)
    if missing or not isinstance(layers, nn.ModuleDict):
        raise PipelineLayoutError(
            f"pipeline parallelism needs a model laid out like the built-in GPT: attributes "
            f"{EMBED!r}, {LAYERS!r} (a ModuleDict keyed '0'..'n-1'), {NORM!r}, {HEAD!r}, and a "
            f"forward that skips ends set to None; {type(model).__name__} lacks "
            f"{missing or [LAYERS + ' as ModuleDict']}. Use model.kind: gpt or pp: 1")


def make_stage_module(model: nn.Module, *, layers: range, first: bool, last: bool) -> nn.Module:
    """A deep copy of ``model`` holding only ``layers`` (and the ends the stage owns)."""
    chunk = copy.deepcopy(model)
    keep = {str(i) for i in layers}
    for name in list(getattr(chunk, LAYERS).keys()):
        if name not in keep:
            del getattr(chunk, LAYERS)[name]
    if not first:
        setattr(chunk, EMBED, None)
    if not last:
        setattr(chunk, NORM, None)
        setattr(chunk, HEAD, None)
    return chunk


def split_model(model: nn.Module, layout: StageLayout) -> list[nn.Module]:
    """The stage modules of ``layout.stage_ids``, in that order."""
    check_splittable(model)
    last = layout.num_stages - 1
    return [make_stage_module(model, layers=layout.layers(s), first=s == 0, last=s == last)
            for s in layout.stage_ids]


class StageUnion(nn.Module):
    """One module over all of a rank's stage modules, with the whole model's FQNs.

    Interleaved ranks hold several stage modules; the optimizer and checkpoints want one
    module whose parameter names match the unsplit model (``embed.tok.weight``,
    ``layers.4.attn.wq.weight``...). This view shares the stage modules' submodules, so it
    owns no parameters of its own and is never called.
    """

    def __init__(self, parts: Sequence[nn.Module]) -> None:
        super().__init__()
        layers: dict[str, nn.Module] = {}
        for part in parts:
            for end in (EMBED, NORM, HEAD):
                if getattr(part, end, None) is not None:
                    setattr(self, end, getattr(part, end))
            layers.update(getattr(part, LAYERS).items())
        self.layers = nn.ModuleDict({k: layers[k] for k in sorted(layers, key=int)})

    def forward(self, *_: Any) -> torch.Tensor:
        raise RuntimeError("StageUnion is a parameter view; run the pipeline schedule instead")


def pp_clip_grad_norm(params: Iterable[nn.Parameter], *, max_norm: float | None,
                      pp_group: Any, device: torch.device) -> float:
    """Total L2 grad norm over every pipeline stage; scales grads down to ``max_norm`` if set.

    Each rank's norm covers its stages only (DTensor grads are reduced over their own mesh
    with ``full_tensor``); the squared norms are summed over the pp group, so the result and
    the clipping equal ``clip_grad_norm_`` on the whole model.
    """
    grads = [p.grad for p in params if p.grad is not None]
    by_mesh: dict[object, list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        by_mesh[(id(g.device_mesh), g.placements) if isinstance(g, DTensor) else "plain"].append(g)
    sq = torch.zeros((), dtype=torch.float32, device=device)
    for group in by_mesh.values():
        n = torch.nn.utils.get_total_norm(group, norm_type=2.0, foreach=True)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        sq += n.detach().float().to(device) ** 2
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(sq, group=pp_group)
    total = math.sqrt(float(sq))
    if max_norm is not None and grads and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for group in by_mesh.values():
            torch._foreach_mul_(group, coef)
    return total


class _GlooP2PTimeout:
    """Makes the schedule's p2p waits honour the job's collective timeout on gloo.

    gloo's recv waits with the timeout its group had when it was created (the long init
    timeout); ``_set_pg_timeout`` reaches collectives but not receives. A stalled pipeline
    peer would then hang for the init timeout instead of ``collective_timeout_s``. The
    schedules wait through the module function ``_wait_batch_p2p``; replacing it with one
    that passes an explicit timeout to ``Work.wait`` fixes that. Only used on CPU: on NCCL a
    timed wait would block the CPU on every transfer, and NCCL's own watchdog applies the
    group timeout already.
    """

    timeout: timedelta | None = None
    _original = staticmethod(_schedules._wait_batch_p2p)

    @classmethod
    def install(cls) -> None:
        _schedules._wait_batch_p2p = cls._wait  # type: ignore[assignment]

    @classmethod
    def _wait(cls, work: list[dist.Work]) -> None:
        if cls.timeout is None:
            cls._original(work)
            return
        for w in work:
            w.wait(cls.timeout)


_SCHEDULES = {
    PPSchedule.GPIPE: ScheduleGPipe,
    PPSchedule.ONE_F_ONE_B: Schedule1F1B,
    PPSchedule.INTERLEAVED_1F1B: ScheduleInterleaved1F1B,
}


class PipelineRunner:
    """The StepRunner for pp > 1: this rank's stage modules, their PipelineStages, a schedule.

    ``train_step`` returns the mean loss over this rank's batch on last-stage ranks and None
    elsewhere; gradients are left in ``model_parts`` for the loop to clip (with
    :meth:`clip_grad_norm`) and step.
    """

    def __init__(self, *, parts: Sequence[nn.Module], stages: Sequence[PipelineStage],
                 schedule: Any, pp_group: Any, device: torch.device,
                 faults: FaultInjector | None = None,
                 p2p_timeouts_s: tuple[float, float] | None = None) -> None:
        self._parts = list(parts)
        self._view: list[nn.Module] = (self._parts if len(self._parts) == 1
                                       else [StageUnion(self._parts)])
        self.stages = list(stages)
        self.schedule = schedule
        self.pp_group = pp_group
        self.device = device
        self.is_first = any(s.is_first for s in self.stages)
        self.is_last = any(s.is_last for s in self.stages)
        self._step = 0
        self._progress: Progress | None = None
        # (first step, later steps): the loop's init / steady-state collective timeouts.
        self._p2p_timeouts_s = p2p_timeouts_s if device.type == "cpu" else None
        self._steps_run = 0
        if self._p2p_timeouts_s is not None:
            _GlooP2PTimeout.install()
        for stage in self.stages:
            self._instrument(stage, faults)

    @property
    def model_parts(self) -> list[nn.Module]:
        # One module per rank (a StageUnion view when it holds several stages), named like
        # the unsplit model, for the optimizer and the checkpointer.
        return self._view

    def _instrument(self, stage: PipelineStage, faults: FaultInjector | None) -> None:
        # Heartbeat phases: the schedule interleaves forwards and backwards, so the phase is
        # set per chunk (two attribute writes). The fault hook wraps the sends only when a
        # p2p_stall is armed for this rank, so normal runs pay nothing.
        fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_one_chunk(*a: Any, **kw: Any) -> Any:
            if self._progress is not None:
                self._progress.enter(Phase.FORWARD)
            return fwd(*a, **kw)

        def backward_one_chunk(*a: Any, **kw: Any) -> Any:
            if self._progress is not None:
                self._progress.enter(Phase.BACKWARD)
            return bwd(*a, **kw)

        stage.forward_one_chunk = forward_one_chunk  # type: ignore[method-assign]
        stage.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]
        f = faults.fault if faults is not None else None
        if faults is not None and f is not None and f.kind == FaultKind.P2P_STALL \
                and f.rank == faults.rank:
            self._arm_p2p_stall(stage, faults)

    def _arm_p2p_stall(self, stage: PipelineStage, faults: FaultInjector) -> None:
        def guard(send_ops: Callable[[int], list[dist.P2POp]]
                  ) -> Callable[[int], list[dist.P2POp]]:
            def wrapped(chunk_id: int) -> list[dist.P2POp]:
                ops = send_ops(chunk_id)
                if ops:  # only a stage that really sends at this point stalls
                    faults.maybe_p2p_stall(self._step)
                return ops
            return wrapped

        stage.get_fwd_send_ops = guard(stage.get_fwd_send_ops)  # type: ignore[method-assign,assignment]
        stage.get_bwd_send_ops = guard(stage.get_bwd_send_ops)  # type: ignore[method-assign,assignment]

    def train_step(self, microbatches: Sequence[Batch], *, step: int,
                   progress: Progress) -> torch.Tensor | None:
        self._step, self._progress = step, progress
        if self._p2p_timeouts_s is not None:
            first, later = self._p2p_timeouts_s
            _GlooP2PTimeout.timeout = timedelta(seconds=first if self._steps_run == 0 else later)
        self._steps_run += 1
        inputs = torch.cat([mb.inputs for mb in microbatches])
        targets = torch.cat([mb.targets for mb in microbatches])
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()
        self.schedule.step(*args, target=targets if self.is_last else None, losses=losses,
                           return_outputs=False)
        if not self.is_last:
            return None
        return torch.stack([x.detach().float() for x in losses]).mean()

    def clip_grad_norm(self, max_norm: float | None) -> float:
        params = [p for m in self.model_parts for p in m.parameters()]
        return pp_clip_grad_norm(params, max_norm=max_norm, pp_group=self.pp_group,
                                 device=self.device)


def build_schedule(*, stages: Sequence[PipelineStage], kind: PPSchedule, n_microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Any:
    cls = _SCHEDULES[kind]
    target = list(stages) if cls is ScheduleInterleaved1F1B else stages[0]
    if cls is not ScheduleInterleaved1F1B and len(stages) != 1:
        raise PipelineLayoutError(f"pp_schedule={kind.value} runs one stage per rank; use "
                                  "interleaved_1f1b for pp_virtual_stages > 1")
    return cls(target, n_microbatches, loss_fn=loss_fn, scale_grads=True)


def build_pipeline_runner(ctx: BuildContext) -> PipelineRunner:
    """Splits ``ctx.built.module`` for this rank's pp coordinate and builds stages + schedule."""
    spec, par = ctx.spec, ctx.spec.parallelism
    if ctx.mesh is None:
        raise PipelineLayoutError("pipeline parallelism needs a process group (pp > 1)")
    pp_mesh = ctx.mesh["pp"]
    model = ctx.built.module
    check_splittable(model)
    layout = StageLayout.build(n_layers=len(getattr(model, LAYERS)), pp=par.pp,
                               virtual=par.pp_virtual_stages, pp_rank=pp_mesh.get_local_rank())
    parts = [ctx.parallelize_chunk(m) for m in split_model(model, layout)]
    group = pp_mesh.get_group()
    stages = [PipelineStage(m, sid, layout.num_stages, ctx.device, group=group)
              for m, sid in zip(parts, layout.stage_ids, strict=True)]
    schedule = build_schedule(stages=stages, kind=par.pp_schedule,
                              n_microbatches=par.pp_microbatches * spec.training.grad_accum_steps,
                              loss_fn=ctx.loss_fn)
    return PipelineRunner(parts=parts, stages=stages, schedule=schedule, pp_group=group,
                          device=ctx.device, faults=ctx.faults,
                          p2p_timeouts_s=(spec.fault_tolerance.init_timeout_s,
                                          spec.fault_tolerance.collective_timeout_s))
