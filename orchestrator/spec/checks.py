"""The checks across a JobSpec's fields (each problem a FieldIssue with its dotted path and
the fix), what runs but trains badly (spec_warnings), and whether a job fits the cluster.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.bounds import limits as lim
from orchestrator.bounds.limits import divisors
from orchestrator.spec.fields import (
    LOOP_FIELDS,
    LOOP_PARALLELISM,
    USER_CODE_FAULTS,
    CommHook,
    ConstraintMode,
    Device,
    FaultKind,
    GPTModel,
    Parallelism,
    PPSchedule,
    SpecKind,
)

if TYPE_CHECKING:
    from orchestrator.spec.job import JobSpec


@dataclass(frozen=True)
class FieldIssue:
    """One problem in a spec: dotted field path, a message with the fix, an error type."""

    loc: str
    msg: str
    type: str = "value_error"


class SpecValidationError(ValueError):
    """A spec that cannot run, with every problem listed. Maps to HTTP 422."""

    def __init__(self, issues: list[FieldIssue]) -> None:
        self.issues = issues
        super().__init__("; ".join(f"{i.loc}: {i.msg}" for i in issues))


def _model_issues(spec: JobSpec) -> list[FieldIssue]:
    p, m = spec.parallelism, spec.model
    out: list[FieldIssue] = []
    if not isinstance(m, GPTModel):
        return out
    if m.d_model % m.n_heads:
        out.append(FieldIssue("model.d_model", f"d_model={m.d_model} is not divisible by "
                              f"n_heads={m.n_heads}; pick n_heads in {divisors(m.d_model)[:12]}"))
    if m.n_heads % p.tp:
        out.append(FieldIssue("parallelism.tp", f"tp={p.tp} does not divide model.n_heads="
                              f"{m.n_heads}; choose tp in {divisors(m.n_heads)}"))
    if m.ffn_dim % p.tp:
        out.append(FieldIssue("parallelism.tp", f"tp={p.tp} does not divide the MLP size "
                              f"{m.ffn_dim}; choose tp in {divisors(m.ffn_dim)[:12]}"))
    stages = p.pp * p.pp_virtual_stages
    if m.n_layers % stages:
        out.append(FieldIssue("parallelism.pp", f"pp={p.pp} x pp_virtual_stages="
                              f"{p.pp_virtual_stages} = {stages} stages does not divide "
                              f"model.n_layers={m.n_layers}; use a stage count in "
                              f"{divisors(m.n_layers)}"))
    if m.moe is not None and m.moe.top_k > m.moe.experts:
        out.append(FieldIssue("model.moe.top_k", f"top_k={m.moe.top_k} exceeds experts="
                              f"{m.moe.experts}; route to at most as many experts as there are"))
    if m.moe is not None and m.moe.experts % p.ep:
        out.append(FieldIssue("parallelism.ep", f"ep={p.ep} does not divide model.moe.experts="
                              f"{m.moe.experts}; choose ep in {divisors(m.moe.experts)}"))
    if p.cp > 1 and m.seq_len % (2 * p.cp):
        out.append(FieldIssue("parallelism.cp", f"context parallel splits the sequence into "
                              f"2*cp={2 * p.cp} chunks; model.seq_len={m.seq_len} must be a "
                              "multiple of it"))
    if p.sequence_parallel and p.tp > 1 and m.seq_len % p.tp:
        out.append(FieldIssue("parallelism.sequence_parallel", f"sequence parallel needs tp={p.tp}"
                              f" to divide model.seq_len={m.seq_len}"))
    return out


def _parallel_issues(spec: JobSpec) -> list[FieldIssue]:
    p, t, r = spec.parallelism, spec.training, spec.resources
    out: list[FieldIssue] = []
    if r.workers is not None and r.workers != p.world_size:
        out.append(FieldIssue("resources.workers", f"workers={r.workers} but tp*pp*dp_shard*"
                              f"dp_replicate*ep*cp = {p.world_size}; set workers to {p.world_size} "
                              "or omit it"))
    if t.micro_batch_size % p.pp_microbatches:
        out.append(FieldIssue("parallelism.pp_microbatches", f"pp_microbatches={p.pp_microbatches}"
                              f" does not divide training.micro_batch_size={t.micro_batch_size}; "
                              f"choose one of {divisors(t.micro_batch_size)}"))
    if p.pp == 1 and (p.pp_microbatches > 1 or p.pp_virtual_stages > 1):
        out.append(FieldIssue("parallelism.pp", "pp_microbatches / pp_virtual_stages need pp > 1;"
                              " set pp or drop them"))
    if p.pp_virtual_stages > 1 and p.pp_schedule != PPSchedule.INTERLEAVED_1F1B:
        out.append(FieldIssue("parallelism.pp_virtual_stages", "virtual stages need pp_schedule="
                              "interleaved_1f1b"))
    if p.pp_schedule == PPSchedule.INTERLEAVED_1F1B and p.pp > 1 and p.pp_virtual_stages < 2:
        out.append(FieldIssue("parallelism.pp_virtual_stages", "interleaved_1f1b needs "
                              "pp_virtual_stages >= 2; set it or use pp_schedule=1f1b"))
    if p.pp > 1 and p.pp_microbatches < p.pp and p.pp_schedule != PPSchedule.GPIPE:
        out.append(FieldIssue("parallelism.pp_microbatches", f"{p.pp_schedule.value} with pp="
                              f"{p.pp} needs pp_microbatches >= {p.pp}"))
    if p.auto and p.world_size > 1:
        out.append(FieldIssue("parallelism.auto", "auto chooses tp/pp/dp_shard/dp_replicate/"
                              "ep/cp; remove them or set auto: false"))
    stage = p.effective_zero_stage()
    if stage in (2, 3) and p.dp_shard == 1:
        out.append(FieldIssue("parallelism.zero_stage", f"zero_stage={stage} shards over dp_shard,"
                              " which is 1; raise dp_shard or use zero_stage 0/1"))
    if stage == 1 and p.dp < 2:
        out.append(FieldIssue("parallelism.zero_stage", "zero_stage=1 needs data parallelism "
                              "(dp_shard * dp_replicate >= 2)"))
    if stage == 1 and (p.tp > 1 or p.pp > 1):
        out.append(FieldIssue("parallelism.zero_stage", "zero_stage=1 (ZeroRedundancyOptimizer "
                              "over DDP) runs without tp and pp only; use zero_stage 0, or 2/3 "
                              "with dp_shard > 1"))
    if t.ddp.comm_hook != CommHook.NONE and (p.dp_shard > 1 or p.tp > 1 or p.pp > 1
                                             or p.ep > 1 or p.cp > 1):
        out.append(FieldIssue("training.ddp.comm_hook", "DDP comm hooks apply to pure DDP "
                              "(dp_replicate only); set comm_hook: none for FSDP/TP/PP/EP/CP"))
    return out + _ep_cp_issues(spec)


def _ep_cp_issues(spec: JobSpec) -> list[FieldIssue]:
    """Expert / context parallel: the combinations the loop runs, and what they need."""
    p, m = spec.parallelism, spec.model
    out: list[FieldIssue] = []
    if isinstance(m, GPTModel) and m.moe is not None and (p.tp > 1 or p.pp > 1):
        out.append(FieldIssue("model.moe", "MoE models run with ep, dp_shard (FSDP) and "
                              "dp_replicate (DDP); set tp and pp to 1"))
    if p.ep > 1:
        if not isinstance(m, GPTModel) or m.moe is None:
            out.append(FieldIssue("parallelism.ep", "ep > 1 splits MoE experts; set model.moe "
                                  "(built-in GPT) or use ep: 1"))
        if p.tp > 1 or p.pp > 1 or p.dp_replicate > 1 or p.cp > 1:
            out.append(FieldIssue("parallelism.ep", "ep runs alone or with dp_shard (FSDP, "
                                  "zero_stage 2/3: experts split by ep, the rest sharded over "
                                  "dp_shard x ep); set tp, pp, dp_replicate and cp to 1"))
        if p.dp_shard > 1 and p.effective_zero_stage() < 2:
            out.append(FieldIssue("parallelism.zero_stage", "ep with dp_shard > 1 shards with "
                                  "FSDP; use zero_stage 2 or 3"))
    if p.cp > 1:
        if spec.resources.device == Device.CPU:
            out.append(FieldIssue("parallelism.cp", "context parallel runs on CUDA only: "
                                  "torch's context_parallel has no sharding strategy for CPU "
                                  "attention (aten._scaled_dot_product_flash_attention_for_cpu);"
                                  " set resources.device: cuda or cp: 1"))
        if p.tp > 1 or p.pp > 1 or p.dp_replicate > 1:
            out.append(FieldIssue("parallelism.cp", "cp runs alone or with dp_shard (FSDP); "
                                  "set tp, pp and dp_replicate to 1"))
        if isinstance(m, GPTModel) and m.dropout > 0:
            out.append(FieldIssue("model.dropout", "context parallel needs dropout 0 "
                                  "(attention dropout masks would differ per sequence shard)"))
        if not isinstance(m, GPTModel):
            out.append(FieldIssue("parallelism.cp", "cp > 1 needs the built-in GPT (its "
                                  "attention is what context_parallel shards)"))
    return out


def _other_issues(spec: JobSpec) -> list[FieldIssue]:
    out: list[FieldIssue] = []
    f = spec.inject_fault
    if f is not None and f.rank >= spec.world_size:
        out.append(FieldIssue("inject_fault.rank", f"rank {f.rank} does not exist; the world "
                              f"size is {spec.world_size} (ranks 0..{spec.world_size - 1})"))
    if f is not None and f.kind == FaultKind.P2P_STALL and spec.parallelism.pp < 2:
        out.append(FieldIssue("inject_fault.kind", "p2p_stall needs pipeline parallelism (pp>=2)"))
    ft = spec.fault_tolerance
    if ft.init_timeout_s < ft.collective_timeout_s:
        out.append(FieldIssue("fault_tolerance.init_timeout_s", "init_timeout_s must be >= "
                              "collective_timeout_s (the first step includes setup)"))
    if spec.resources.device == Device.CUDA and spec.resources.gpus_per_worker != 1:
        out.append(FieldIssue("resources.gpus_per_worker", "cuda jobs use one GPU per worker; "
                              "set gpus_per_worker: 1"))
    return out


def _size_issues(spec: JobSpec) -> list[FieldIssue]:
    p = spec.parallelism
    if p.world_size > lim.MAX_WORLD_SIZE:
        return [FieldIssue("parallelism", f"tp*pp*dp_shard*dp_replicate*ep*cp = {p.world_size} "
                           f"ranks; a job has at most {lim.MAX_WORLD_SIZE}, lower the degrees")]
    if spec.global_batch_size > lim.MAX_BATCH:
        return [FieldIssue("training.micro_batch_size", "micro_batch_size * grad_accum_steps * "
                           f"dp = {spec.global_batch_size} sequences per step; at most "
                           f"{lim.MAX_BATCH}, lower one of them")]
    return []


def _entrypoint_issues(spec: JobSpec) -> list[FieldIssue]:
    """A user-code job: no built-in loop blocks, only the parallelism user code can use."""
    out = [FieldIssue(key, f"{key} belongs to the built-in training loop, but this job runs "
                      "its own code (entrypoint); remove one of the two")
           for key in LOOP_FIELDS if key in spec.model_fields_set]
    f = spec.inject_fault
    if f is not None and f.kind.value not in USER_CODE_FAULTS:
        out.append(FieldIssue("inject_fault.kind", f"{f.kind.value} acts inside the built-in "
                              "training loop; a job with an entrypoint can inject only "
                              f"{', '.join(USER_CODE_FAULTS)} (it fires in the pre-flight check)"))
    p, r = spec.parallelism, spec.resources
    # By value, not by presence: a stored spec carries every parallelism field at its default.
    defaults = Parallelism()
    out += [FieldIssue(f"parallelism.{key}", f"{key} applies to the built-in loop only; the "
                       "entrypoint builds its own model, so remove it")
            for key in LOOP_PARALLELISM if getattr(p, key) != getattr(defaults, key)]
    if r.workers is not None and r.workers != p.world_size:
        out.append(FieldIssue("resources.workers", f"workers={r.workers} but tp*pp*dp_shard*"
                              f"dp_replicate*ep*cp = {p.world_size}; set workers to {p.world_size} "
                              "or omit it"))
    stage = p.effective_zero_stage()
    if stage in (2, 3) and p.dp_shard == 1:
        out.append(FieldIssue("parallelism.zero_stage", f"zero_stage={stage} shards over "
                              "dp_shard, which is 1; raise dp_shard or use zero_stage 0"))
    if stage == 1:
        out.append(FieldIssue("parallelism.zero_stage", "zero_stage=1 wraps the optimizer, "
                              "which user code builds itself; use 0, 2 or 3"))
    return out


def cross_checks(spec: JobSpec) -> list[FieldIssue]:
    """Checks that span fields. Returns every issue (empty when the spec can run)."""
    if spec.entrypoint is not None:
        if spec.world_size > lim.MAX_WORLD_SIZE:
            return _size_issues(spec)
        return _entrypoint_issues(spec) + _other_issues(spec)
    size = _size_issues(spec)
    if size:
        return size  # the other checks assume a job of a size that can exist
    return _model_issues(spec) + _parallel_issues(spec) + _other_issues(spec)


def spec_warnings(spec: JobSpec) -> list[FieldIssue]:
    """What runs but is known to train badly, with the fix; the job is still accepted. The
    figures are bench/topk_convergence.py's: the tiny GPT on 2 ranks, topk_ratio 0.1, the mean
    loss of steps 391-400 over 2 seeds, against the same run uncompressed."""
    d = spec.training.ddp
    if spec.kind is SpecKind.USER_CODE or d.comm_hook != CommHook.TOPK or d.topk_start_iter > 0:
        return []
    return [FieldIssue("training.ddp.topk_start_iter", "topk from the first step learns much "
                       "slower than uncompressed training (tiny GPT, 400 steps: loss 5.1x the "
                       "uncompressed one with sgd, 2.5x with adamw); warm start with plain "
                       "all-reduces (topk_start_iter: 100 of 400 steps brought both to 1.8x), "
                       "or use comm_hook int8 (1.25x Top-K 10%'s bytes, as low a loss as "
                       "uncompressed)", "convergence")]


def check_fits_cluster(spec: JobSpec, *, max_gpus_per_node: int) -> list[FieldIssue]:
    """Checks against the cluster's shape (not its load). Empty list when it can ever fit."""
    p = spec.parallelism
    if spec.resources.device == Device.CPU or max_gpus_per_node <= 0:
        return []
    if p.tp > max_gpus_per_node and spec.placement.mode == ConstraintMode.REQUIRED:
        return [FieldIssue("parallelism.tp", f"a TP group of {p.tp} GPUs must stay inside one "
                           f"{spec.placement.tp_within.value}, but the largest node has "
                           f"{max_gpus_per_node} GPUs; use tp <= {max_gpus_per_node} or "
                           "placement.mode: preferred")]
    return []
