"""Public response models. Routes build these from store records; rows never leave the API.

The client (api/client.py) parses responses into the same models, so the wire format has one
definition.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from orchestrator.lifecycle import JobState


class _Out(BaseModel):
    # from_attributes: records are frozen dataclasses; extra="ignore" lets an older client read
    # a newer server's answers.
    model_config = ConfigDict(from_attributes=True, frozen=True, extra="ignore")


class Condition(_Out):
    """An open diagnosis: the job is hung (or straggling) since `since`."""

    kind: Literal["hung", "straggling"] = Field(description="hung, or straggling (progress "
                                                "continues, one rank is late).")
    verdict: str = Field(description="The diagnosis' verdict class, e.g. NOT_JOINED.")
    headline: str = Field(description="Who did or did not do what: 'rank 1 never entered "
                          "all_reduce #15'.")
    since: datetime = Field(description="When the stall (or straggler) was detected.")
    text: str = Field(description="The whole condition: 'hung since 06:56:21 UTC — ...'.")
    culprit_ranks: list[int]
    diagnosis_id: int = Field(description="GET /v1/jobs/{id}/diagnoses lists it.")
    attempt: int
    step: int | None = Field(description="The job's last step when diagnosed; a hang clears "
                             "once a newer step is reported.")


class JobSummary(_Out):
    id: str = Field(description="Job id, `job-...`.")
    name: str = Field(description="Job name from the spec, stored verbatim.")
    owner: str = Field(description="User who submitted the job.")
    state: JobState = Field(description="Lifecycle state.")
    priority: int = Field(description="Higher is scheduled first.")
    submission_id: str | None = Field(description="Client-chosen idempotency key.")
    world_size: int = Field(description="Number of ranks.")
    total_steps: int = Field(description="Optimizer steps the job will run.")
    current_attempt: int = Field(description="Attempt number; 0 before the first attempt.")
    last_step: int | None = Field(description="Last step any rank reported.")
    last_loss: float | None = Field(description="Loss at the last reported step.")
    pending_reason: dict[str, Any] | None = Field(description="Why a queued job waits.")
    failure_reason: str | None = Field(description="Typed failure reason when FAILED.")
    message: str = Field(description="The last state change's message (for a failed job: "
                         "why, naming the culprit rank when one is known).")
    status: str = Field(default="", description="Where the job is now, in one line: the "
                        "open condition, why it waits, its step, or how it ended.")
    condition: Condition | None = Field(default=None, description="Set while a diagnosis is "
                                        "open (the job is hung or straggling).")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = Field(default=None, description="When the job first ran "
                                        "(entered RUNNING); null before that.")
    cancelled_by: str | None = Field(default=None, description="Who asked to cancel the "
                                     "job, once someone did.")


class Job(JobSummary):
    spec: dict[str, Any] = Field(validation_alias=AliasChoices("spec_doc", "spec"),
                                 description="The validated JobSpec, defaults filled in.")


class SpecWarning(_Out):
    loc: str = Field(description="The field, dotted: training.ddp.comm_hook.")
    msg: str = Field(description="What is known to go wrong, with the figure and the fix.")


class SubmitResult(Job):
    created: bool = Field(description="False when an earlier submission with the same "
                          "submission_id already created this job.")
    warnings: list[SpecWarning] = Field(default_factory=list, description="What in the spec "
                                        "runs but is known to train badly (the job is "
                                        "accepted); also recorded as a warning event.")


class JobPage(_Out):
    items: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null at "
                                    "the end.")


class Event(_Out):
    id: int = Field(description="Monotonic; pass the last seen id as `after` to poll.")
    job_id: str
    at: datetime
    kind: str = Field(description="state | info | warning | error")
    src: str | None = Field(description="Previous state (state events).")
    dst: str | None = Field(description="New state (state events).")
    reason: str | None
    message: str
    data: dict[str, Any]


class EventList(_Out):
    items: list[Event]


class Attempt(_Out):
    job_id: str
    number: int
    state: str
    created_at: datetime
    ended_at: datetime | None
    failure_reason: str | None
    message: str
    placement: dict[str, Any] | None


class AttemptList(_Out):
    items: list[Attempt]


class RankCondition(_Out):
    state: str = Field(description="From the open diagnosis: not_joined | exited | straggler "
                       "| mismatched | wedged | blocked for culprits; waiting | idle for peers.")
    collective: str | None = Field(description="The collective it waits in (or never "
                                   "entered), e.g. 'all_reduce #15'.")


class Rank(_Out):
    job_id: str
    attempt: int
    rank: int
    node: str | None
    node_id: str | None
    gpu: int | None
    coords: dict[str, Any] = Field(description="Mesh coordinates, e.g. {pp, dp_replicate, "
                                   "dp_shard, tp}.")
    state: str
    step: int | None
    phase: str | None
    last_heartbeat: datetime | None
    pid: int | None
    collectives: int | None = Field(default=None, description="A script that reports no "
                                    "steps: the collectives this rank has enqueued (its "
                                    "progress).")
    progress_at: datetime | None = Field(default=None, description="When `collectives` last "
                                         "grew.")
    condition: RankCondition | None = Field(default=None, description="What the open "
                                            "diagnosis says this rank is doing.")


class RankList(_Out):
    items: list[Rank]


class MetricPoint(_Out):
    attempt: int
    rank: int
    step: int
    time: float = Field(description="Unix time in seconds.")
    loss: float | None
    grad_norm: float | None
    step_time_s: float | None
    tokens_per_s: float | None
    lr: float | None = None
    grad_comm_bytes: int | None = Field(
        default=None, description="Bytes one rank handed to the gradient collectives (DDP).")
    grad_compression_ratio: float | None = Field(
        default=None, description="Dense fp32 gradient payload / grad_comm_bytes (DDP).")
    moe_aux_loss: float | None = Field(
        default=None, description="MoE load-balancing loss, mean over the MoE layers.")
    values: dict[str, float] = Field(
        default_factory=dict, description="The step's other reported numeric metrics "
        "(val_acc, mfu, ...), those `keys` asks for.")


class MetricList(_Out):
    keys: list[str] = Field(default_factory=list, description=(
        "Every metric name the job stored beyond the fixed fields, first reported first."))
    items: list[MetricPoint]


class MetricSeries(_Out):
    """One metric of one rank, one entry per bucket of steps (parallel lists)."""

    key: str
    rank: int
    step: list[int] = Field(description="The bucket's first step.")
    time: list[float] = Field(description="The unix time of the bucket's first row.")
    mean: list[float]
    min: list[float]
    max: list[float]
    count: list[int] = Field(description="Rows in the bucket (1: a raw row).")


class MetricSeriesPage(_Out):
    keys: list[str] = Field(description="Every metric name the job stored beyond the fixed "
                            "fields (the fixed ones are `fixed`).")
    fixed: list[str]
    from_step: int | None = Field(description="First step in range (null: no rows).")
    to_step: int | None
    bucket_steps: int = Field(description="Steps per bucket; 1 when every row is returned.")
    rows: int = Field(description="Metric rows in range, over the ranks asked for.")
    items: list[MetricSeries]


class UsagePoint(_Out):
    """One rank's process at one moment (GPU fields null without a GPU or NVML)."""

    attempt: int
    rank: int
    node: str | None
    at: float = Field(description="Unix time in seconds.")
    cpu_percent: float | None = Field(description="CPU time of the rank's process over the "
                                      "last sampling window, in % of one core.")
    rss_bytes: int | None = Field(description="Resident memory of the rank's process.")
    gpu_util: float | None = Field(description="Its GPU's utilisation, % (NVML).")
    gpu_mem_bytes: int | None = Field(description="Memory in use on its GPU (NVML).")
    gpu_mem_total_bytes: int | None


class UsageList(_Out):
    items: list[UsagePoint]


class GpuUsage(_Out):
    index: int
    util: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None


class NodeUsagePoint(_Out):
    node: str
    at: float = Field(description="Unix time in seconds.")
    cpu_percent: float | None = Field(description="The whole node's CPU use, %.")
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    gpus: list[GpuUsage] = Field(description="Every GPU NVML sees on the node.")


class NodeUsageList(_Out):
    items: list[NodeUsagePoint]


class CheckpointInfo(_Out):
    attempt: int
    step: int
    at: datetime = Field(description="When rank 0 marked it complete.")
    size_bytes: int | None
    path: str
    removed: bool = Field(description="Pruned from disk since (checkpoint.keep).")


class CheckpointList(_Out):
    items: list[CheckpointInfo]


class StackFrame(_Out):
    file: str
    line: int
    func: str
    code: str = Field(description="The source line, when the stack printed it.")
    kind: Literal["user", "library", "wrapper"] = Field(description="user: the job's own "
                                                        "code; library: the standard library "
                                                        "and installed packages; wrapper: "
                                                        "what starts a rank (runpy, Ray, "
                                                        "meshyard's runner).")


class StackGroup(_Out):
    stack: str = Field(description="One Python stack, as traceback.format_stack prints it "
                       "(the group's lowest rank's).")
    ranks: list[int] = Field(description="The ranks with a thread in this stack: the same "
                             "user and library frames (wrapper frames may differ).")
    ranks_text: str
    threads: list[str] = Field(description="Those threads' names; '(training)' marks the "
                               "training thread.")
    training: bool
    frames: list[StackFrame] = Field(default_factory=list, description="The stack's frames, "
                                     "outermost first.")
    user_frame: StackFrame | None = Field(default=None, description="The innermost frame of "
                                          "the job's own code (else of a library).")


class NativeStackGroup(_Out):
    ranks: list[int] = Field(description="Ranks whose py-spy dumps read the same but for "
                             "pids, thread ids and addresses.")
    ranks_text: str
    text: str = Field(description="The lowest rank's `py-spy dump --native` output (native "
                      "frames included), at most 32 KiB.")


class StackRequest(_Out):
    id: int
    job_id: str
    attempt: int
    requested_by: str
    requested_at: datetime
    state: Literal["pending", "collecting", "done", "failed"]
    finished_at: datetime | None
    groups: list[StackGroup] = Field(default=[], description="Identical stacks merged; "
                                     "training threads first.")
    ranks_answered: int = 0
    errors: dict[str, str] = Field(default={}, description="Rank -> why it gave no stacks.")
    error: str = Field(default="", description="Why nothing was collected.")
    native: list[NativeStackGroup] = Field(default=[], description="Where py-spy is installed "
                                           "on the nodes: each rank's native stacks, grouped.")


class StackRequestList(_Out):
    items: list[StackRequest]


class LogLine(_Out):
    id: int
    attempt: int
    rank: int | None
    at: datetime
    stream: str
    line: str


class LogList(_Out):
    items: list[LogLine]


class Diagnosis(_Out):
    id: int
    job_id: str
    attempt: int
    created_at: datetime
    verdict: str
    culprit_ranks: list[int]
    confidence: float | None = None
    summary: str
    evidence: list[dict[str, Any]] = []
    report: dict[str, Any]


class DiagnosisList(_Out):
    items: list[Diagnosis]


class Node(_Out):
    name: str
    node_id: str | None
    alive: bool
    labels: dict[str, Any]
    gpus: int
    cpus: float
    updated_at: datetime


class Isolation(_Out):
    mode: str = Field(description="isolated: user code's ranks are confined to their own job; "
                      "trusted: nothing is confined and any user's code can act as admin.")
    confined: bool = Field(description="Whether this control plane's host confines ranks now.")
    detail: str = Field(description="What is confined, or why nothing is.")


class Cluster(_Out):
    nodes: list[Node]
    total_gpus: int
    total_cpus: float
    isolation: Isolation | None = Field(default=None, description="Tenant isolation (None: "
                                        "this server runs no jobs).")


class NodeTopology(_Out):
    name: str
    node_id: str | None
    topology: dict[str, Any] = Field(description="The node's stored topology (GPUs, links, "
                                     "NICs, levels), as discovered or declared.")


class Topology(_Out):
    nodes: list[NodeTopology]


class TokenInfo(_Out):
    id: int = Field(description="Pass to DELETE /v1/tokens/{id} to revoke it.")
    user: str
    label: str
    created_at: datetime
    revoked: bool


class TokenCreated(TokenInfo):
    token: str = Field(description="The token itself; shown once, only its digest is kept.")
    role: str = Field(description="The user's role: admin, user or viewer.")


class TokenList(_Out):
    items: list[TokenInfo]


class UserInfo(_Out):
    name: str
    role: str
    created_at: datetime


class UserList(_Out):
    items: list[UserInfo]


class QuotaInfo(_Out):
    """Effective limits (null: unlimited), and which of them were set for this user."""

    user: str
    max_queued_jobs: int | None
    max_running_gpus: int | None
    max_running_cpus: float | None
    max_priority: int | None
    explicit: list[str] = Field(description="Limits set for this user; the others are the "
                                "server's defaults (or unlimited, for admins).")


class Health(_Out):
    status: Literal["ok"]


class Readiness(_Out):
    status: Literal["ready", "not_ready"]
    database: bool
    migrations: bool
    detail: str = ""


class FieldError(_Out):
    loc: str
    msg: str
    type: str


class Problem(_Out):
    """application/problem+json (RFC 9457). Documented in OpenAPI for every error status."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    errors: list[FieldError] | None = None


class Package(_Out):
    package: str = Field(description="What a spec's entrypoint.working_dir names: "
                         "`package:sha256:<hex>`.")
    sha256: str = Field(description="SHA-256 of the uploaded zip.")
    bytes: int = Field(description="Size of the zip.")
    created: bool = Field(description="False when the caller had uploaded this package "
                          "before.")


class NodeHealthOut(_Out):
    """A node in the health ledger (GET /v1/nodes)."""

    name: str
    node_id: str | None
    alive: bool
    state: str = Field(description="healthy | suspect | cordoned")
    reason: str
    since: datetime | None
    until: datetime | None = Field(description="When the cordon ends; null: not cordoned, "
                                   "or permanent")
    permanent: bool
    cordoned_gpus: list[int]
    diagnosis_ids: list[int] = Field(description="Diagnoses among the evidence.")
    evidence: list[dict[str, Any]] = Field(description="Newest last: kind (diagnosis | "
                                           "failure | preflight | admin), severity, reason, "
                                           "at, job_id, gpu, diagnosis_id, verdict.")


class NodeHealthList(_Out):
    items: list[NodeHealthOut]


class CordonBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=500, pattern=r"^[^\x00-\x1f\x7f]*$",
                        description="Why (kept with the node's evidence).")
    permanent: bool = Field(default=False, description="Until an admin uncordons it.")


class GoodputSegment(_Out):
    start: float = Field(description="Unix time in seconds.")
    end: float
    kind: str = Field(description="queued | starting | productive | recomputed | hung | "
                      "recovering | stopping")
    attempt: int
    seconds: float


class GoodputOut(_Out):
    """Where a job's wall time went (GET /v1/jobs/{id}/goodput)."""

    wall_s: float = Field(description="Submit to the terminal state (or now).")
    ratio: float = Field(description="productive / wall_s")
    seconds: dict[str, float] = Field(description="Per bucket; they add up to wall_s.")
    steps_recomputed: int = Field(description="Steps redone after restarts.")
    segments: list[GoodputSegment]
