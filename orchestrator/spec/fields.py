"""The sections of a JobSpec (resources, parallelism, placement, model, data, training,
checkpointing, fault tolerance, watchdog, debug, pre-flight, fault injection), their enums and
bounds. Pure (pydantic + stdlib).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)

from orchestrator.bounds import limits as lim
from orchestrator.mesh import Degrees
from orchestrator.usercode.entrypoint import IMPORT_PATH_RE

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


class SpecKind(StrEnum):
    BUILT_IN = "built_in"  # meshyard's training loop (model, data, training, checkpoint)
    USER_CODE = "user_code"  # the user's command or function (entrypoint)


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


class Parallelism(_Frozen, Degrees):
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
    topk_start_iter: int = Field(
        default=0, ge=0, le=lim.MAX_STEPS,
        description="topk warm start: plain all-reduce for the first topk_start_iter steps, "
        "Top-K from then on (0: from the first step).")


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


class ResumeFrom(_Frozen):
    job: str = Field(pattern=r"^job-[0-9a-f]{12}$", description="The job whose checkpoint "
                     "this one starts from (one of yours; admins: any).")
    step: int = Field(ge=0, le=lim.MAX_STEPS, description="That job's kept checkpoint of this "
                      "step (GET /v1/jobs/{job}/checkpoints lists them).")


class Checkpointing(_Frozen):
    enabled: bool = Field(default=True, description="Save distributed checkpoints.")
    every_steps: PositiveInt = Field(default=50, le=lim.MAX_STEPS,
        description="Save every N steps.")
    keep: PositiveInt = Field(default=2, le=1000, description="Checkpoints kept on disk.")
    async_save: bool = Field(default=True, description="Async save where the backend allows.")
    resume_from: ResumeFrom | None = Field(default=None, description="Start from another "
        "job's checkpoint: it is placed among this job's checkpoints before the first "
        "attempt, which resumes from it (the built-in loop at its step; user code finds it "
        "with `meshyard.train.get_checkpoint()`).")


MAX_RETRY_RULES = 32


class RetryOn(_Frozen):
    """Which failures of the job's own code are restarted (up to max_failures). Failures
    that point at the infrastructure (a worker or node lost, device / NIC errors, hangs) are
    always restarted; an exception or non-zero exit of the user's code only when it matches
    one of these."""

    exceptions: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$",
                                                      max_length=200)]] = Field(
        default_factory=list, max_length=MAX_RETRY_RULES,
        description="Exception class names (`ConnectionError`, `torch.OutOfMemoryError`): "
        "the last dotted part is compared with the raised type's name.")
    exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list, max_length=MAX_RETRY_RULES,
        description="Exit statuses of a rank process that ended without a Python exception.")
    patterns: list[Annotated[str, StringConstraints(min_length=3, max_length=200)]] = Field(
        default_factory=list, max_length=MAX_RETRY_RULES,
        description="Plain substrings (not regular expressions) of the error message or "
        "its traceback's last lines.")

    def matches(self, *, error_type: str, exit_code: int | None, text: str) -> bool:
        name = error_type.rsplit(".", 1)[-1]
        return (any(e.rsplit(".", 1)[-1] == name for e in self.exceptions)
                or (exit_code is not None and exit_code in self.exit_codes)
                or any(p in text for p in self.patterns))


class FaultTolerance(_Frozen):
    max_failures: int = Field(
        default=3, ge=0, le=1000, description="Failed attempts restarted before FAILED."
    )
    retry_on: RetryOn = Field(
        default_factory=RetryOn,
        description="Failures of the job's own code that are restarted too (by default "
        "they fail the job at once: the next attempt would raise the same way).")
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


class Preemption(_Frozen):
    preemptible: bool = Field(default=True, description="A queued job of higher priority that "
                              "does not fit may stop this one: it saves a checkpoint, is "
                              "requeued, and resumes from it when it fits again (its restart "
                              "budget untouched). false: never stopped for another job; only "
                              "admins may set it.")
    grace_s: float = Field(default=60.0, ge=1, le=3600, description="When stopped for another "
                           "job: seconds the ranks get to checkpoint and exit (the built-in "
                           "loop saves at its next step; user code sees "
                           "`meshyard.train.get_context().should_stop()` and SIGTERM) before "
                           "they are killed.")


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
