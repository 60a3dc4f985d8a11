"""parallelize(): TP -> activation checkpointing -> FSDP/DDP, with PyTorch's own APIs.

Order matters and is fixed:

1. TP first (``parallelize_module`` over ``mesh["tp"]``): it replaces weights with DTensors
   sharded on tp; everything after must see those DTensors.
2. Activation checkpointing next: it wraps each block, and FSDP must shard the *wrapped* block
   so that its all-gather is re-issued for the recomputation in backward.
3. Data parallelism last, wrapping what TP produced (`meshyard.parallel`, shared with user
   code's `prepare_model`):
   * ZeRO-3 / ZeRO-2: FSDP2 ``fully_shard`` per block then the root, over ``mesh["dp_shard"]``,
     or the 2D ``mesh["dp_replicate", "dp_shard"]`` (HSDP) when both degrees are > 1.
     ZeRO-2 keeps parameters unsharded after forward (``reshard_after_forward=False``).
   * ZeRO-1: DDP over the flattened ``dp`` group here; the optimizer is a
     ``ZeroRedundancyOptimizer`` (``build_optimizer``).
   * ZeRO-0: DDP over the dp group with ``bucket_cap_mb`` and the spec's comm hook
     (fp16 / bf16 / PowerSGD / int8 from torch, Top-K from `workers.loop.compression`); with TP or
     on a pipeline stage, FSDP2's ``replicate`` over the same ranks (`apply_replicate`).

A pipeline stage goes through this same function (`workers.loop.pipeline`), one call per stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from meshyard.parallel import UnsupportedLayoutError, apply_data_parallel, ddp_group, dp_kind
from orchestrator.mesh import MeshShape
from orchestrator.spec import JobSpec
from workers.loop import compression
from workers.loop.model import BuiltModel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def _blocks(module: nn.Module, built: BuiltModel) -> list[tuple[str, nn.Module]]:
    if built.blocks_attr is None:
        return []
    container = getattr(module, built.blocks_attr, None)
    if container is None:
        return []
    return list(container.named_children())


def apply_tp(module: nn.Module, *, built: BuiltModel, tp_mesh: DeviceMesh) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    for _, block in _blocks(module, built):
        if built.block_plan:
            parallelize_module(block, tp_mesh, built.block_plan)
    if built.sequence_parallel_entry:
        parallelize_module(module, tp_mesh, _sp_root_plan(module))
    plan = built.root_plan
    if callable(plan):
        plan(module, tp_mesh)
    elif plan:
        parallelize_module(module, tp_mesh, plan)


def _sp_root_plan(module: nn.Module) -> dict[str, Any]:
    # The replicated embedding hands a sequence shard to the first block; the final norm
    # gathers the sequence back. Ends missing on a pipeline chunk are skipped.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput

    plan: dict[str, Any] = {}
    if getattr(module, "embed", None) is not None:
        plan["embed"] = PrepareModuleOutput(output_layouts=Replicate(),
                                            desired_output_layouts=Shard(1))
    if getattr(module, "norm", None) is not None:
        plan["norm"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                          desired_input_layouts=(Replicate(),),
                                          use_local_output=True)
    return plan


def apply_ac(module: nn.Module, *, built: BuiltModel) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
    )

    container = getattr(module, built.blocks_attr or "", None)
    if container is None:
        return
    for name, block in _blocks(module, built):
        container.register_module(name, checkpoint_wrapper(block, preserve_rng_state=False))


def apply_ep(module: nn.Module, *, built: BuiltModel, dims: MeshShape, mesh: DeviceMesh,
             reshard_after_forward: bool) -> None:
    """Expert parallel: each MoE layer keeps its ``experts / ep`` experts and exchanges tokens
    over ``mesh["ep"]``; FSDP2 shards the rest over the flattened dp_shard x ep ranks (all of
    them read distinct data). The experts' gradients already sum the ep ranks' tokens (the
    all-to-all's backward brings them home), so they are averaged over dp_shard and divided
    by ep: by FSDP's gradient divide factor when dp_shard > 1 (experts sharded over
    ``mesh["dp_shard"]``), else by a gradient hook (experts left out of FSDP)."""
    from torch.distributed.fsdp import fully_shard

    from workers.loop.moe import moe_layers

    ep_mesh = mesh["ep"]
    layers = moe_layers(module)
    for layer in layers:
        layer.shard_experts(ep_mesh)
    expert_params = {p for layer in layers for p in layer.experts.parameters()}
    if dims.dp_shard > 1:
        for layer in layers:
            fsdp = fully_shard(layer.experts, mesh=mesh["dp_shard"],
                               reshard_after_forward=reshard_after_forward)
            fsdp.set_gradient_divide_factor(float(dims.dp_shard * dims.ep))
            # A custom factor is NCCL's PreMulSum otherwise, which gloo lacks: sum, then scale.
            fsdp.set_force_sum_reduction_for_comms(True)
        ignored: set[nn.Parameter] | None = None
    else:
        for p in expert_params:
            p.register_hook(lambda g: g / dims.ep)
        ignored = expert_params
    data_mesh = mesh["dp_shard", "ep"]._flatten("dp_shard_ep")
    for _, block in _blocks(module, built):
        fully_shard(block, mesh=data_mesh, reshard_after_forward=reshard_after_forward,
                    ignored_params=ignored)
    fully_shard(module, mesh=data_mesh, reshard_after_forward=False, ignored_params=ignored)


def apply_cp_fsdp(module: nn.Module, *, built: BuiltModel, mesh: DeviceMesh,
                  device: torch.device, reshard_after_forward: bool) -> None:
    """Context parallel: FSDP2 over the flattened dp_shard x cp ranks (CP ranks hold the same
    parameters and each computes gradients from its sequence chunks, so gradients average
    over both). The sequence split itself happens per step (`workers.loop.runner`, torch's
    ``context_parallel``), which shards SDPA's inputs and runs ring attention; it has no CPU
    attention strategy, hence CUDA only."""
    if device.type != "cuda":
        raise ValueError("context parallel (parallelism.cp > 1) runs on CUDA only: torch's "
                         "context_parallel has no sharding strategy for CPU attention "
                         "(aten._scaled_dot_product_flash_attention_for_cpu); run on GPUs "
                         "(resources.device: cuda) or set cp: 1")
    from meshyard.parallel import apply_fsdp

    apply_fsdp(module, blocks=[b for _, b in _blocks(module, built)],
               mesh=mesh["dp_shard", "cp"]._flatten("dp_shard_cp"),
               reshard_after_forward=reshard_after_forward)


def apply_replicate(module: nn.Module, *, dims: MeshShape, mesh: DeviceMesh) -> None:
    """ZeRO-0 data parallelism with FSDP2's ``replicate`` over the data-parallel ranks
    (``mesh["dp_replicate"]``, or the flattened ``mesh["dp"]`` when dp_shard > 1), for what
    DDP cannot wrap: TP's DTensor parameters, and pipeline stages (DDP's first-iteration
    bucket rebuild sees the gradients of every microbatch of a schedule and fails an internal
    assert, torch 2.13). ``replicate`` makes an ``FSDPModule``, whose gradient sync the
    runners switch off until the last microbatch, as for FSDP."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(module, mesh=mesh["dp"] if dims.dp_shard > 1 else mesh["dp_replicate"])


def dp_plan(spec: JobSpec, dims: MeshShape) -> str:
    """Which data-parallel wrapper applies: "none", "ddp", "zero1", "fsdp" (ZeRO-2/3),
    "replicate" (ZeRO-0 with TP or pipeline stages: `apply_replicate`), or "ep-fsdp" (expert
    parallel: `apply_ep`), "cp-fsdp" (context parallel: `apply_cp_fsdp`)."""
    if dims.ep > 1:
        return "ep-fsdp"
    if dims.cp > 1:
        return "cp-fsdp"
    kind = dp_kind(dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard,
                   zero_stage=spec.parallelism.effective_zero_stage())
    if kind == "zero1" and (dims.tp > 1 or dims.pp > 1):
        raise UnsupportedLayoutError(
            "zero_stage=1 (ZeroRedundancyOptimizer over DDP) runs without TP and pipeline "
            "parallelism only; use zero_stage 0, or 2/3 with dp_shard > 1")
    return "replicate" if kind == "ddp" and (dims.tp > 1 or dims.pp > 1) else kind


def parallelize(module: nn.Module, *, built: BuiltModel, spec: JobSpec, dims: MeshShape,
                mesh: DeviceMesh | None, device: torch.device) -> nn.Module:
    """Applies TP -> AC -> FSDP/DDP to ``module`` (the whole model or one pipeline stage).

    ``built`` carries the TP plan and where the blocks live. Returns the module to train
    (a DDP wrapper for DDP / ZeRO-1, else ``module`` itself, changed in place). The data
    parallelism is `meshyard.parallel`'s, the same code user jobs get from
    `meshyard.train.torch.prepare_model`.
    """
    module.to(device)
    if dims.tp > 1:
        assert mesh is not None
        apply_tp(module, built=built, tp_mesh=mesh["tp"])
    if spec.parallelism.activation_checkpointing:
        apply_ac(module, built=built)
    kind = dp_plan(spec, dims)
    if kind == "ep-fsdp":
        assert mesh is not None
        apply_ep(module, built=built, dims=dims, mesh=mesh,
                 reshard_after_forward=spec.parallelism.effective_zero_stage() != 2)
        return module
    if kind == "cp-fsdp":
        assert mesh is not None
        apply_cp_fsdp(module, built=built, mesh=mesh, device=device,
                      reshard_after_forward=spec.parallelism.effective_zero_stage() != 2)
        return module
    if kind == "replicate":
        assert mesh is not None
        apply_replicate(module, dims=dims, mesh=mesh)
        return module
    out = apply_data_parallel(
        module, kind=kind, mesh=mesh, blocks=[b for _, b in _blocks(module, built)],
        device=device, dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard, tp=dims.tp,
        zero_stage=spec.parallelism.effective_zero_stage(),
        bucket_cap_mb=spec.training.ddp.bucket_cap_mb)
    if kind in ("ddp", "zero1"):
        assert mesh is not None
        compression.register(out, opts=spec.training.ddp, seed=spec.training.seed,
                             group=ddp_group(mesh, kind=kind, dp_shard=dims.dp_shard))
    return out


def build_optimizer(spec: JobSpec, *, parts: list[nn.Module], dims: MeshShape,
                    mesh: DeviceMesh | None) -> torch.optim.Optimizer:
    """AdamW / SGD over every part's parameters; ZeroRedundancyOptimizer for ZeRO-1."""
    t = spec.training
    params = [p for m in parts for p in m.parameters() if p.requires_grad]
    cls: type[torch.optim.Optimizer]
    kw: dict[str, Any] = {"lr": t.lr, "weight_decay": t.weight_decay}
    if t.optimizer == "adamw":
        cls = torch.optim.AdamW
    else:
        cls, kw = torch.optim.SGD, {**kw, "momentum": 0.9}
    if dp_plan(spec, dims) == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        assert mesh is not None
        return ZeroRedundancyOptimizer(params, optimizer_class=cls,
                                       process_group=mesh.get_group("dp"), **kw)
    return cls(params, **kw)
