"""The training loop: env -> process group -> mesh -> model -> parallelize -> steps.

``run_training`` is the launcher-independent core. torchrun (``workers.loop.launch``) and the Ray
worker actor both call it in-process; the actor passes its own callbacks and a
``threading.Event`` to cancel between steps.

One step::

    data      DataSource.batches(step)           (fault hook: crash / slow / user_hang)
    forward   \\  StepRunner.train_step         (LocalStepRunner or the pipeline runner)
    backward  /   gradient sync inside (DDP / FSDP / PP)
    optimizer clip, optimizer.step; on a sync step the loss all-reduce
              (fault hook: hang / mismatch / desync)
    checkpoint every N steps (DCP, async where allowed)

The loop's own collective is one all-reduce of [loss sums, counts, stop votes] over the world
every few steps (workers/loop/stepsync.py: the first and last step, fault steps, and otherwise
about every 0.5 s of training), so the logged loss is the global mean whatever the layout
(TP ranks count the same loss once each, non-last pipeline stages contribute zero), a
metrics row reaches ``on_step`` at that sync, and a ``stop_event`` set on any rank stops
every rank after the same step (with a checkpoint when checkpointing is on).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from orchestrator.mesh import MeshShape
from orchestrator.preflight.verdict import ExpectedLink
from orchestrator.spec import GPTModel, JobSpec
from workers.host.env import DistEnv, init_distributed, select_device, set_collective_timeout
from workers.host.faults import FaultInjector
from workers.host.preflight import run_preflight
from workers.loop import compression, mfu
from workers.loop.callbacks import NullCallbacks, Phase, TrainingCallbacks, report_checkpoint
from workers.loop.checkpoint import Checkpointer
from workers.loop.data import DataSource
from workers.loop.heartbeat import HeartbeatThread, Progress, dump_flight_recorder
from workers.loop.mesh import build_mesh
from workers.loop.model import BuiltModel, build_model, loss_fn
from workers.loop.moe import aux_loss_metric
from workers.loop.parallelize import build_optimizer, dp_plan, parallelize
from workers.loop.runner import build_runner
from workers.loop.step_contract import BuildContext, StepRunner
from workers.loop.stepsync import StepSync

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class TrainingResult:
    first_step: int          # first step run in this call (resume point + 1)
    last_step: int           # last completed step (first_step - 1 when none ran)
    last_loss: float | None
    stopped: bool            # True when stop_event ended the run early


@dataclass
class _Run:
    spec: JobSpec
    rank: int
    world: int
    device: torch.device
    runner: StepRunner
    optimizer: torch.optim.Optimizer
    data: DataSource
    faults: FaultInjector
    progress: Progress
    callbacks: TrainingCallbacks
    tokens_per_step: int
    # Clipping runs collectives (DTensor gradients of FSDP / TP, the pp-wide norm).
    clip_communicates: bool = True
    # Model FLOPs per step over the job's peak FLOP/s (CUDA with a known peak), else None.
    mfu_per_tokens_per_s: float | None = None


def run_training(
    spec: JobSpec,
    *,
    out_dir: str | Path,
    callbacks: TrainingCallbacks | None = None,
    steps: int | None = None,
    seed: int | None = None,
    stop_event: threading.Event | None = None,
    dist_env: DistEnv | None = None,
    reference: bool = False,
    attempt: int = 1,
    checkpoint_dir: str | Path | None = None,
    checkpoint_store: str | None = None,
    heartbeat_interval_s: float = 1.0,
    preflight_links: Mapping[str, Mapping[str, ExpectedLink]] | None = None,
) -> TrainingResult:
    """Trains ``spec`` on this rank; every rank of the job calls it.

    ``steps`` overrides ``spec.training.steps`` (the total, including resumed steps);
    ``seed`` overrides ``spec.training.seed``. ``reference=True`` runs the whole global batch
    in this one process without any parallelism (the parity baseline). The default process
    group is created from ``dist_env`` (default: torchrun variables) unless it already exists;
    a group created here is destroyed on return. Checkpoints go to ``checkpoint_dir``
    (default ``out_dir/checkpoints``) and training resumes from the newest complete one there;
    ``checkpoint_store``, the cluster's checkpoint store that meshyard's host processes copy
    them to and from, is named in a failed save's message.
    Heartbeats go to ``callbacks.on_heartbeat`` every ``heartbeat_interval_s`` (0 disables).
    ``preflight_links``: the pre-flight check's expected figures for this rank's links, per
    backend.
    Metrics include ``mfu`` on CUDA devices with a known peak (see workers.loop.mfu), and
    ``grad_comm_bytes`` / ``grad_compression_ratio`` under a DDP comm hook
    (workers.loop.compression).
    """
    cbs = callbacks or NullCallbacks()
    env = DistEnv.single() if reference else (dist_env or DistEnv.from_environ())
    seed = spec.training.seed if seed is None else seed
    total = spec.training.steps if steps is None else steps
    dims = MeshShape() if reference else MeshShape.from_parallelism(spec.parallelism)
    dims.validate_world(env.world_size)
    progress = Progress()
    hb = HeartbeatThread(progress, cbs, rank=env.rank, interval_s=heartbeat_interval_s)
    if heartbeat_interval_s > 0:  # 0 disables heartbeats (overhead benchmark baseline)
        hb.start()
    created_pg = ok = False
    try:
        # Build (and resolve a user import path) before joining the group: a bad spec fails
        # on every rank by itself instead of leaving peers waiting in a collective.
        built = build_model(spec, seed=seed)
        device = select_device(spec, local_rank=env.local_rank)
        created_pg = init_distributed(spec, dist_env=env, device=device)
        run = _setup(spec, built=built, dims=dims, env=env, device=device, seed=seed,
                     reference=reference, progress=progress, callbacks=cbs, attempt=attempt,
                     preflight_links=preflight_links or {})
        ckpt = Checkpointer(spec, root=checkpoint_dir or Path(out_dir) / "checkpoints",
                            parts=run.runner.model_parts, optimizer=run.optimizer,
                            rank=env.rank, on_saved=lambda info: report_checkpoint(cbs, info),
                            store_uri=checkpoint_store)
        progress.background_groups = ckpt.background_groups
        result = _train(run, ckpt=ckpt, total=total, stop_event=stop_event)
        progress.enter(Phase.DONE)
        ok = True
        return result
    except Exception:
        if dist.is_initialized():
            dump_flight_recorder(Path(out_dir) / "flight_recorder" / f"rank_{env.rank}")
        raise
    finally:
        # On an error the last heartbeat stays the one taken while stuck (watchdog evidence).
        hb.stop(final_beat=ok)
        if created_pg and dist.is_initialized():
            dist.destroy_process_group()


def _setup(spec: JobSpec, *, built: Any, dims: MeshShape, env: DistEnv,
           device: torch.device, seed: int, reference: bool, progress: Progress,
           callbacks: TrainingCallbacks, attempt: int,
           preflight_links: Mapping[str, Mapping[str, ExpectedLink]]) -> _Run:
    mesh = build_mesh(dims, device_type=device.type) if env.world_size > 1 else None
    n_params = sum(p.numel() for p in built.module.parameters())  # before sharding
    # The reference baseline never misbehaves, whatever the spec injects into the real job.
    faults = FaultInjector(None, rank=0) if reference else \
        FaultInjector.from_spec(spec, rank=env.rank, attempt=attempt)
    if spec.preflight.enabled and not reference and env.world_size > 1:
        checked = run_preflight(spec.preflight, mesh=mesh, rank=env.rank, device=device,
                                faults=faults, expected=preflight_links)
        callbacks.on_log("INFO", f"pre-flight check passed in {checked['seconds']:.3f} s "
                         f"({checked['tests']} tests of {checked['bytes'] / 2**20:g} MiB)")

    runner = build_step_runner(spec, built=built, dims=dims, mesh=mesh, device=device,
                               rank=env.rank, faults=faults)
    optimizer = build_optimizer(spec, parts=runner.model_parts, dims=dims, mesh=mesh)
    n_shards = MeshShape.from_parallelism(spec.parallelism).data_shards
    shards = range(n_shards) if reference else [dims.dp_index(env.rank)]
    data = DataSource(spec, seed=seed, shards=shards, vocab_size=built.vocab_size,
                      seq_len=built.seq_len, device=device, num_shards=n_shards)
    callbacks.on_log("INFO", f"rank {env.rank}/{env.world_size} on {device}: dims={dims} "
                     f"dp={dp_plan(spec, dims)} runner={type(runner).__name__} "
                     f"optimizer={type(optimizer).__name__}")
    return _Run(spec=spec, rank=env.rank, world=env.world_size, device=device, runner=runner,
                optimizer=optimizer, data=data, faults=faults, progress=progress,
                callbacks=callbacks, tokens_per_step=spec.global_batch_size * built.seq_len,
                clip_communicates=dims.pp > 1 or dims.tp > 1 or dims.dp_shard > 1,
                mfu_per_tokens_per_s=_mfu_factor(spec, n_params=n_params, device=device,
                                                 world=env.world_size))


def build_step_runner(spec: JobSpec, *, built: BuiltModel, dims: MeshShape,
                      mesh: DeviceMesh | None, device: torch.device, rank: int,
                      faults: FaultInjector) -> StepRunner:
    """This rank's share of the model, parallelized (`workers.loop.parallelize.parallelize` on the
    whole model, or on each of its pipeline stages when pp > 1), in the runner that trains
    it; ``runner.model_parts`` hold its parameters."""

    def chunk(m: torch.nn.Module) -> torch.nn.Module:
        return parallelize(m, built=built, spec=spec, dims=dims, mesh=mesh, device=device)

    return build_runner(BuildContext(spec=spec, built=built, dims=dims, mesh=mesh,
                                     device=device, rank=rank, faults=faults, loss_fn=loss_fn,
                                     parallelize_chunk=chunk))


def _mfu_factor(spec: JobSpec, *, n_params: int, device: torch.device,
                world: int) -> float | None:
    peak = mfu.peak_flops(device)
    m = spec.model
    if peak is None or not isinstance(m, GPTModel):
        return None
    fpt = mfu.flops_per_token(n_params=n_params, n_layers=m.n_layers, d_model=m.d_model,
                              seq_len=m.seq_len)
    return mfu.mfu(tokens_per_s=1.0, flops_per_token=fpt, peak=peak, world_size=world)


def _settle(run: _Run) -> None:
    """On gloo, marks what is enqueued as completed (Progress.settle_collectives) where the
    training thread has waited for all of it: the end of a step's backward (DDP and FSDP wait
    for their gradient collectives before it returns; gloo's two threads finish DDP's buckets
    in any order), and a step's start when collectives ran since (the loop's own, a clip that
    communicates, a checkpoint). Not on NCCL: the watchdog thread keeps that watermark in
    order, and a collective can still be running on the GPU stream when the host returns
    from backward."""
    if run.device.type == "cpu":
        run.progress.settle_collectives()


def _one_step(run: _Run, step: int, *, settle_first: bool) -> tuple[dict[str, Any],
                                                                     torch.Tensor | None]:
    """One step up to the optimizer -> (its metrics row without ``loss``, the local loss)."""
    t0 = time.perf_counter()
    run.progress.enter(Phase.DATA, step)
    if settle_first:
        _settle(run)
    run.faults.before_step(step)
    batches = run.data.batches(step)
    loss = run.runner.train_step(batches, step=step, progress=run.progress)
    run.progress.enter(Phase.OPTIMIZER)
    _settle(run)
    # The runner clips: a pipeline rank holds only its stages' parameters and sums the norm
    # over the pp group so clipping matches the whole model.
    grad_norm = run.runner.clip_grad_norm(run.spec.training.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    out: dict[str, Any] = {"step": step, "time": time.time(), "step_time_s": dt,
                           "tokens_per_s": run.tokens_per_step / dt, "grad_norm": grad_norm,
                           "lr": _current_lr(run.optimizer)}
    if run.mfu_per_tokens_per_s is not None:
        out["mfu"] = run.mfu_per_tokens_per_s * out["tokens_per_s"]
    for part in run.runner.model_parts:
        hook = compression.hook_state(part)
        if hook is not None:
            out.update(hook.take_step_metrics())
        aux = aux_loss_metric(part)
        if aux is not None:
            out["moe_aux_loss"] = aux
    return out, loss


def _current_lr(optimizer: torch.optim.Optimizer) -> float | None:
    """The learning rate the step just used (the first parameter group's)."""
    groups = getattr(optimizer, "param_groups", None) or []
    lr = groups[0].get("lr") if groups else None
    return float(lr) if isinstance(lr, int | float | torch.Tensor) else None


def _train(run: _Run, *, ckpt: Checkpointer, total: int,
           stop_event: threading.Event | None) -> TrainingResult:
    run.progress.enter(Phase.CHECKPOINT)
    start = ckpt.load_latest()
    run.progress.start_step = start
    if start:
        run.callbacks.on_log("INFO", f"resumed from checkpoint at step {start}"
                             + ("" if ckpt.rng_restored else " (no RNG state saved: reseeded)")
                             + (" with the comm hook's state" if ckpt.hook_restored else ""))
    last_loss: float | None = None
    step = start
    stopped = False
    sync = StepSync(world=run.world, device=run.device, faults=run.faults)
    pending = getattr(run.callbacks, "on_step_pending", None)
    settle_first = True
    for step in range(start + 1, total + 1):
        row, loss = _one_step(run, step, settle_first=settle_first)
        sync.add(row, loss)
        if pending is not None:
            pending(row)
        if step == start + 1:
            # Init and the first step (compilation, allocator warm-up, lazy groups) are done:
            # from here on a collective that takes this long is a hang.
            set_collective_timeout(run.spec.fault_tolerance.collective_timeout_s)
        synced = sync.due(step, first=step == start + 1, last=step == total)
        if synced:
            rows, stop = sync.flush(
                step, stop=stop_event is not None and stop_event.is_set())
            stopped = stop and step < total
            last_loss = rows[-1]["loss"]
            for r in rows:
                run.callbacks.on_step(r)
        run.progress.enter(Phase.CHECKPOINT)
        run.faults.before_checkpoint(step)
        # A stop (cancel / preemption) saves where it is, so a later attempt resumes there.
        saved = ckpt.maybe_save(step, final=step == total or stopped)
        settle_first = synced or saved or run.clip_communicates
        if stopped:
            run.callbacks.on_log("INFO", f"stopped on request after step {step}")
            break
    run.progress.enter(Phase.CHECKPOINT)
    ckpt.wait()
    return TrainingResult(first_step=start + 1, last_step=step, last_loss=last_loss,
                          stopped=stopped)
