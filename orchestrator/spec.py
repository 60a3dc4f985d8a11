"""JobSpec: the versioned, frozen description of one training job.

Pure module (pydantic + stdlib only). Every consumer — the REST API, the CLI, the workers —
goes through :func:`parse_spec`, which returns a :class:`JobSpec` or raises
:class:`SpecValidationError` listing every problem with its dotted field path and a fix.

World size is the product of the parallel degrees: ``tp * pp * dp_shard * dp_replicate``.
Global batch is ``micro_batch_size * grad_accum_steps * dp_shard * dp_replicate`` sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from orchestrator import limits as lim
from orchestrator.entrypoint import IMPORT_PATH_RE, Entrypoint
from orchestrator.limits import divisors

SPEC_VERSION = 1
# Names land in the database and in log lines: no NUL or other control characters.
PRINTABLE_RE = r"^[^\x00-\x1f\x7f]+$"
# The built-in loop's blocks: a job with an entrypoint runs its own code and has none of them.
LOOP_FIELDS = ("model", "data", "training", "checkpoint")
# Fault kinds that fire outside the built-in loop (in the pre-flight check), so a user-code
# job may inject them too.
USER_CODE_FAULTS = ("slow_send",)
# Parallelism options only the built-in loop acts on.
LOOP_PARALLELISM = ("auto", "auto_gpus", "auto_global_batch", "pp_schedule", "pp_microbatches",
                    "pp_virtual_stages", "sequence_parallel", "activation_checkpointing", "ep",
                    "cp")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False,
                              allow_inf_nan=False)


class Device(StrEnum):
    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


class PPSchedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"


class TopologyLevel(StrEnum):
    NVLINK_DOMAIN = "nvlink_domain"
    NODE = "node"


class ConstraintMode(StrEnum):
    REQUIRED = "required"
    PREFERRED = "preferred"


class CommHook(StrEnum):
    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    INT8 = "int8"
    TOPK = "topk"


class FaultKind(StrEnum):
    HANG = "hang"
    CRASH = "crash"
    MISMATCH = "mismatch"
    DESYNC = "desync"
    SLOW = "slow"
    P2P_STALL = "p2p_stall"
    USER_HANG = "user_hang"
    SLOW_SEND = "slow_send"  # rank R's pre-flight sends start `seconds` late
    SLOW_SAVE = "slow_save"  # rank R spends `seconds` more in the checkpoint save after step S
    NIC_HANG = "nic_hang"  # a hang with a NIC error in the rank's log (hardware evidence)


class WatchdogAction(StrEnum):
    OBSERVE = "observe"
    RESTART = "restart"
    FAIL = "fail"


PositiveInt = Annotated[int, Field(ge=1)]
Degree = Annotated[int, Field(ge=1, le=lim.MAX_WORLD_SIZE)]


class Resources(_Frozen):
    workers: int | None = Field(
        default=None, ge=1, le=65536,
        description="Number of worker processes (ranks). Defaults to the world size; if given "
        "it must equal tp * pp * dp_shard * dp_replicate * ep * cp.",
    )
    gpus_per_worker: int = Field(
        default=1, ge=0, le=1,
        description="GPUs per worker when the device is cuda (one rank drives one GPU). "
        "Ignored for cpu jobs.",
    )
    cpus_per_worker: float = Field(
        default=1.0, gt=0, le=256, description="CPU cores reserved per worker in the Ray bundle."
    )
    device: Device = Field(
        default=Device.AUTO,
        description="auto: cuda when the cluster has free GPUs, else cpu. cuda uses NCCL, "
        "cpu uses gloo.",
    )


class Parallelism(_Frozen):
    tp: Degree = Field(default=1, description="Tensor-parallel degree (fastest-varying).")
    pp: Degree = Field(default=1, description="Pipeline-parallel degree (slowest-varying).")
    dp_shard: Degree = Field(
        default=1, description="Sharded data-parallel degree (FSDP / ZeRO group size)."
    )
    dp_replicate: Degree = Field(
        default=1, description="Replicated data-parallel degree (DDP, or the HSDP replica count)."
    )
    ep: Degree = Field(
        default=1, description="Expert-parallel degree: the MoE experts are split over ep ranks, "
        "which read distinct data and exchange tokens by all-to-all (needs model.moe).",
    )
    cp: Degree = Field(
        default=1, description="Context-parallel degree: each attention layer's sequence is "
        "split over cp ranks (ring exchange of K/V; CUDA only).",
    )
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        default=None,
        description="Sharding of optimizer state / gradients / parameters across dp_shard. "
        "None picks 3 when dp_shard > 1 and 0 otherwise. 1 uses ZeroRedundancyOptimizer; 2 is "
        "fully_shard(reshard_after_forward=False); 3 is fully_shard.",
    )
    pp_schedule: PPSchedule = Field(
        default=PPSchedule.ONE_F_ONE_B,
        description="Pipeline schedule: gpipe, 1f1b, interleaved_1f1b.",
    )
    pp_microbatches: PositiveInt = Field(
        default=1, le=lim.MAX_BATCH,
        description="Microbatches per pipeline step; must divide micro_batch_size."
    )
    pp_virtual_stages: PositiveInt = Field(
        default=1, le=lim.MAX_LAYERS,
        description="Model chunks per pipeline rank (>1 only with interleaved_1f1b)."
    )
    sequence_parallel: bool = Field(
        default=False, description="Shard norms and dropout along the sequence dimension in TP."
    )
    activation_checkpointing: bool = Field(
        default=False, description="Recompute each transformer block's activations in backward."
    )
    auto: bool = Field(
        default=False,
        description="Let the planner choose every degree, the ZeRO stage, microbatches and "
        "activation checkpointing at submit time (`parallelism: auto` is short for "
        "{auto: true}); the server stores the resolved spec and records the plan as an event.",
    )
    auto_gpus: Degree | None = Field(
        default=None, description="With auto: GPUs to plan for (default: every free GPU)."
    )
    auto_global_batch: PositiveInt | None = Field(
        default=None, le=lim.MAX_BATCH,
        description="With auto: sequences per optimizer step (default: "
        "training.micro_batch_size * grad_accum_steps per planned GPU)."
    )

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp_shard * self.dp_replicate * self.ep * self.cp

    @property
    def dp(self) -> int:
        return self.dp_shard * self.dp_replicate

    @property
    def data_shards(self) -> int:
        """Ranks reading distinct data (expert-parallel ranks each read their own)."""
        return self.dp * self.ep

    def effective_zero_stage(self) -> int:
        if self.zero_stage is not None:
            return self.zero_stage
        return 3 if self.dp_shard > 1 else 0


class PlacementConstraints(_Frozen):
    tp_within: TopologyLevel = Field(
        default=TopologyLevel.NVLINK_DOMAIN,
        description="Topology level each TP group must (or should) stay inside.",
    )
    mode: ConstraintMode = Field(
        default=ConstraintMode.REQUIRED,
        description="required: wait rather than violate tp_within. preferred: best effort.",
    )
    avoid_nodes: tuple[Annotated[str, Field(max_length=lim.MAX_NAME_CHARS)], ...] = Field(
        default=(), max_length=lim.MAX_CLUSTER_NODES,
        description="Node names or ids never to place this job on."
    )
    timeout_s: float = Field(
        default=300.0, gt=0, le=86400,
        description="How long the gang reservation may take before the job returns to QUEUED; "
        "also how long a job that can never fit the cluster waits before it fails as "
        "INFEASIBLE.",
    )
    wait_for_capacity: bool = Field(
        default=False,
        description="Keep waiting when the job can never fit the cluster as it is (an "
        "autoscaling cluster will grow) instead of failing it as INFEASIBLE.",
    )


class MoE(_Frozen):
    experts: int = Field(ge=2, le=256, description="Experts per MoE layer (every block's MLP).")
    top_k: int = Field(default=2, ge=1, le=8, description="Experts each token is routed to.")
    capacity_factor: float = Field(
        default=1.25, gt=0, le=16,
        description="Slots per expert per sequence = ceil(capacity_factor * seq_len * top_k / "
        "experts); tokens past an expert's capacity are dropped (first choices first).")
    aux_loss_coef: float = Field(
        default=0.01, ge=0, le=1,
        description="Weight of the load-balancing auxiliary loss (Switch Transformer / GShard, "
        "mean over the MoE layers) added to the training loss; 0 disables it. The reported "
        "`loss` stays the language-model loss; the auxiliary one is `moe_aux_loss`.")


class GPTModel(_Frozen):
    kind: Literal["gpt"] = Field(default="gpt", description="Built-in decoder-only transformer.")
    n_layers: PositiveInt = Field(default=4, le=lim.MAX_LAYERS, description="Transformer blocks.")
    n_heads: PositiveInt = Field(default=4, le=1024, description="Attention heads.")
    d_model: PositiveInt = Field(default=128, le=lim.MAX_HIDDEN, description="Hidden size.")
    d_ff: int | None = Field(
        default=None, ge=1, le=lim.MAX_FFN, description="MLP inner size; defaults to 4 * d_model."
    )
    vocab_size: PositiveInt = Field(default=256, le=lim.MAX_VOCAB, description="Vocabulary size.")
    seq_len: PositiveInt = Field(default=64, le=lim.MAX_SEQ_LEN, description="Sequence length.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout probability.")
    moe: MoE | None = Field(
        default=None, description="Mixture-of-experts MLPs (router + experts) in every block; "
        "the experts are split over parallelism.ep.")

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model


class ImportModel(_Frozen):
    kind: Literal["import"] = Field(description="A user model built by an import path.")
    path: str = Field(
        description="`pkg.module:build`; build(**kwargs) returns (module, tp_plan) or a module.",
        pattern=IMPORT_PATH_RE.pattern,
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword args for build().")
    vocab_size: PositiveInt = Field(default=256, le=lim.MAX_VOCAB,
                                    description="Vocabulary size the model expects.")
    seq_len: PositiveInt = Field(default=64, le=lim.MAX_SEQ_LEN,
                                 description="Sequence length the model expects.")


class SyntheticData(_Frozen):
    kind: Literal["synthetic"] = Field(default="synthetic", description="Random tokens.")


class TextFileData(_Frozen):
    kind: Literal["text_file"] = Field(description="A local text file read as bytes (vocab 256).")
    path: str = Field(min_length=1, max_length=4096, pattern=PRINTABLE_RE,
                      description="Path readable by every worker, under one of the server's "
                      "data roots (default: <data dir>/datasets).")


class TokenFileData(_Frozen):
    kind: Literal["tokens"] = Field(description="A flat file of token ids (nanoGPT / llm.c "
                                    ".bin), memory-mapped, sharded by data-parallel rank.")
    path: str = Field(min_length=1, max_length=4096, pattern=PRINTABLE_RE,
                      description="Path readable by every worker, under one of the server's "
                      "data roots (default: <data dir>/datasets).")
    dtype: Literal["auto", "uint16", "uint32"] = Field(
        default="auto", description="Token width; auto: from llm.c's header (version 1: "
        "uint16, 2: uint32), uint16 for a headerless file (nanoGPT).")
    header: Literal["auto", "none", "llmc"] = Field(
        default="auto", description="llmc: a 1024-byte llm.c header (magic 20240520) precedes "
        "the tokens; auto: detected by its magic.")


class DDPOptions(_Frozen):
    bucket_cap_mb: float = Field(default=25.0, gt=0, le=4096, description="DDP bucket size (MiB).")
    comm_hook: CommHook = Field(
        default=CommHook.NONE,
        description="DDP gradient compression hook: fp16 / bf16 casts, powersgd (low rank), "
        "int8 (torch's per-tensor uint8 quantization) or topk (Top-K sparsification with error "
        "feedback, topk_ratio of each gradient sent per step).")
    powersgd_rank: PositiveInt = Field(default=1, le=64, description="PowerSGD matrix rank.")
    powersgd_start_iter: int = Field(
        default=2, ge=1, le=lim.MAX_STEPS,
        description="PowerSGD warm start: plain all-reduce before this iteration."
    )
    topk_ratio: float = Field(
        default=0.01, ge=1e-4, le=1.0,
        description="topk: fraction of each parameter's gradient entries sent per step (the "
        "largest in magnitude after adding the residual); the rest accumulates as the residual.")


class Training(_Frozen):
    steps: PositiveInt = Field(default=100, le=lim.MAX_STEPS, description="Optimizer steps.")
    micro_batch_size: PositiveInt = Field(
        default=8, le=lim.MAX_BATCH, description="Sequences per DP rank per micro-step."
    )
    grad_accum_steps: PositiveInt = Field(default=1, le=lim.MAX_ACCUM_STEPS,
                                          description="Micro-steps per optimizer step.")
    optimizer: Literal["adamw", "sgd"] = Field(default="adamw", description="Optimizer.")
    lr: float = Field(default=3e-3, gt=0, le=10, description="Learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="Weight decay.")
    grad_clip: float | None = Field(default=1.0, gt=0, le=1e9,
                                    description="Max grad norm; null disables.")
    seed: int = Field(default=0, ge=0, le=lim.MAX_SEED, description="Seed for model init and data.")
    ddp: DDPOptions = Field(default_factory=DDPOptions, description="DDP options.")


class Checkpointing(_Frozen):
    enabled: bool = Field(default=True, description="Save distributed checkpoints.")
    every_steps: PositiveInt = Field(default=50, le=lim.MAX_STEPS,
        description="Save every N steps.")
    keep: PositiveInt = Field(default=2, le=1000, description="Checkpoints kept on disk.")
    async_save: bool = Field(default=True, description="Async save where the backend allows.")


class FaultTolerance(_Frozen):
    max_failures: int = Field(
        default=3, ge=0, le=1000, description="Failed attempts restarted before FAILED."
    )
    init_timeout_s: float = Field(
        default=600.0, gt=0, le=86400,
        description="Collective timeout for process-group init and the first step.",
    )
    collective_timeout_s: float = Field(
        default=300.0, gt=0, le=86400, description="Collective timeout after the first step."
    )


class Watchdog(_Frozen):
    stall_timeout_s: float | None = Field(
        default=None, gt=0, le=86400,
        description="Stall when no rank's step advances this long; null adapts to step time.",
    )
    first_step_timeout_s: float | None = Field(
        default=None, gt=0, le=86400, description="Stall threshold before the first step."
    )
    checkpoint_timeout_s: float | None = Field(
        default=None, gt=0, le=86400,
        description="Stall threshold while a rank saves or loads a checkpoint; null: the "
        "first-step threshold.",
    )
    action: WatchdogAction = Field(
        default=WatchdogAction.OBSERVE, description="On a hang: observe, restart or fail."
    )


class Debug(_Frozen):
    nccl_debug: Literal["NONE", "VERSION", "WARN", "INFO", "TRACE"] = Field(
        default="WARN", description="NCCL_DEBUG level."
    )
    nccl_debug_subsys: str = Field(
        default="INIT,COLL,P2P,NET", pattern=r"^\^?[A-Z0-9_]+(,[A-Z0-9_]+)*$",
        description="NCCL_DEBUG_SUBSYS list.",
    )
    flight_recorder_entries: int = Field(
        default=2000, ge=0, le=1_000_000, description="Flight Recorder ring size (0 disables)."
    )


class Preflight(_Frozen):
    enabled: bool = Field(default=True, description="Before step 1 of every attempt, the "
                          "placed gang times an all-reduce per process group and a p2p ring "
                          "(rank r -> r+1); a link far slower than its expected figure or its "
                          "peers fails the attempt before training starts, and its node is "
                          "re-placed around.")
    size_mib: float = Field(default=1.0, gt=0, le=64, description="Message size per test.")
    repeats: int = Field(default=3, ge=1, le=10, description="Timed runs per test (the best "
                         "counts).")
    min_ratio: float = Field(default=0.1, gt=0, le=1, description="A test whose bandwidth is "
                             "below this fraction of its link's expected figure (calibrated or "
                             "default) or of the median of its kind fails.")
    timeout_s: float = Field(default=10.0, gt=0, le=120, description="The whole check's "
                             "bound; a test still running then fails it.")


class InjectFault(_Frozen):
    kind: FaultKind = Field(description="Fault to inject (test and demo use only).")
    rank: int = Field(ge=0, lt=lim.MAX_WORLD_SIZE, description="Global rank that misbehaves.")
    step: int = Field(default=1, ge=0, le=lim.MAX_STEPS,
        description="Step at which the fault fires.")
    seconds: float = Field(default=1.0, ge=0, le=3600, description="Sleep per step for `slow`, per "
                           "send for `slow_send`, once for `slow_save`.")
    attempt: int | None = Field(
        default=1, ge=1, le=1001,
        description="Only inject in this attempt number (null: every attempt).",
    )


class JobSpec(_Frozen):
    version: Literal[1] = Field(default=SPEC_VERSION, description="JobSpec schema version.")
    name: str = Field(min_length=1, max_length=lim.MAX_NAME_CHARS, pattern=PRINTABLE_RE,
                      description="Human-readable job name (no control characters).")
    priority: int = Field(default=0, ge=-1000, le=1000, description="Higher is scheduled "
                          "first (non-admins: at most their max_priority quota, default 0).")
    resources: Resources = Field(default_factory=Resources, description="Per-worker resources.")
    parallelism: Parallelism = Field(default_factory=Parallelism, description="Parallel degrees.")
    placement: PlacementConstraints = Field(
        default_factory=PlacementConstraints, description="Topology constraints."
    )
    model: GPTModel | ImportModel = Field(
        default_factory=GPTModel, discriminator="kind", description="Model to train."
    )
    data: SyntheticData | TextFileData | TokenFileData = Field(
        default_factory=SyntheticData, discriminator="kind", description="Training data."
    )
    training: Training = Field(default_factory=Training, description="Optimization settings.")
    checkpoint: Checkpointing = Field(default_factory=Checkpointing, description="Checkpoints.")
    fault_tolerance: FaultTolerance = Field(
        default_factory=FaultTolerance, description="Restarts and timeouts."
    )
    watchdog: Watchdog = Field(default_factory=Watchdog, description="Hang detection.")
    preflight: Preflight = Field(default_factory=Preflight,
                                 description="Collective check on the placement before step 1.")
    debug: Debug = Field(default_factory=Debug, description="NCCL and Flight Recorder debugging.")
    inject_fault: InjectFault | None = Field(
        default=None, description="Fault injection; accepted only when the server allows it."
    )
    entrypoint: Entrypoint | None = Field(
        default=None, description="The user's own training code (a command or a function run "
        "once per rank) instead of the built-in loop (model / data / training / checkpoint).")

    @model_serializer(mode="wrap")
    def _without_unused_loop(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A user-code job has no built-in loop: its stored and shown spec leaves the loop's
        # defaults out (they parse back to the same JobSpec).
        out = handler(self)
        if self.entrypoint is not None and isinstance(out, dict):
            for key in LOOP_FIELDS:
                out.pop(key, None)
            if out.get("inject_fault") is None:
                out.pop("inject_fault", None)
        return out

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: Any) -> Any:
        # `model: {n_layers: 2}` means the built-in GPT; `kind` is only needed to choose another.
        if isinstance(data, dict):
            data = dict(data)
            if data.get("parallelism") == "auto":
                data["parallelism"] = {"auto": True}
            for key, default in (("model", "gpt"), ("data", "synthetic")):
                if isinstance(data.get(key), dict) and "kind" not in data[key]:
                    data[key] = {"kind": default, **data[key]}
        return data

    @property
    def world_size(self) -> int:
        return self.parallelism.world_size

    @property
    def global_batch_size(self) -> int:
        t = self.training
        return t.micro_batch_size * t.grad_accum_steps * self.parallelism.data_shards

    @property
    def total_steps(self) -> int:
        """Steps the job will run; 0 when unknown (user code that states no `steps`)."""
        if self.entrypoint is not None:
            return self.entrypoint.steps or 0
        return self.training.steps

    @model_validator(mode="after")
    def _cross_field(self, info: ValidationInfo) -> JobSpec:
        if info.context and info.context.get("defer_cross_checks"):
            return self
        issues = cross_checks(self)
        if issues:
            raise ValueError("; ".join(f"{i.loc}: {i.msg}" for i in issues))
        return self


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


def _loc(parts: tuple[int | str, ...]) -> str:
    # pydantic adds the union tag ("gpt", "import") into the path; users never type it.
    keep = [str(p) for p in parts
            if p not in ("gpt", "import", "synthetic", "text_file", "tokens")]
    return ".".join(keep) or "<root>"


def _from_pydantic(err: ValidationError) -> list[FieldIssue]:
    out = []
    for e in err.errors(include_url=False):
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = f"unknown field {e['loc'][-1]!r}; remove it (check the spelling against " \
                  "`meshyard spec schema`)"
        elif e["type"] == "missing":
            msg = "field required"
        out.append(FieldIssue(_loc(tuple(e["loc"])), msg, e["type"]))
    return out


def parse_spec(data: Any) -> JobSpec:
    """Validates raw data into a JobSpec, or raises SpecValidationError with every problem.

    >>> parse_spec({"name": "x", "parallelism": {"tp": 3}}).world_size
    Traceback (most recent call last):
    ...
    orchestrator.spec.SpecValidationError: parallelism.tp: tp=3 does not divide model.n_heads=4; ...
    """
    if not isinstance(data, dict):
        raise SpecValidationError([FieldIssue("<root>", "a job spec must be a mapping of fields "
                                              f"(got {type(data).__name__})", "type_error")])
    try:
        spec = JobSpec.model_validate(data, context={"defer_cross_checks": True})
    except ValidationError as exc:
        raise SpecValidationError(_from_pydantic(exc)) from None
    issues = cross_checks(spec)
    if issues:
        raise SpecValidationError(issues)
    return spec


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
