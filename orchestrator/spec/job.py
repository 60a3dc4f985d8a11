"""JobSpec: the versioned, frozen description of one training job, and parse_spec. Pure."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from orchestrator.bounds import limits as lim
from orchestrator.spec.checks import (
    FieldIssue,
    SpecValidationError,
    cross_checks,
)
from orchestrator.spec.fields import (
    LOOP_FIELDS,
    PRINTABLE_RE,
    SPEC_VERSION,
    Checkpointing,
    Debug,
    FaultTolerance,
    GPTModel,
    ImportModel,
    InjectFault,
    Parallelism,
    PlacementConstraints,
    Preemption,
    Preflight,
    Resources,
    SpecKind,
    SyntheticData,
    TextFileData,
    TokenFileData,
    Training,
    Watchdog,
    _Frozen,
)
from orchestrator.usercode.entrypoint import Entrypoint


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
    preemption: Preemption = Field(default_factory=Preemption, description="Whether a "
                                   "higher-priority job may stop this one, and its grace.")
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
    def kind(self) -> SpecKind:
        """What the ranks run: the built-in training loop, or the user's own code."""
        return SpecKind.USER_CODE if self.entrypoint is not None else SpecKind.BUILT_IN

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
