"""JobSpec: the versioned, frozen description of one training job.

Pure module (pydantic + stdlib only). Every consumer — the REST API, the CLI, the workers —
goes through :func:`parse_spec`, which returns a :class:`JobSpec` or raises
:class:`SpecValidationError` listing every problem with its dotted field path and a fix.

World size is the product of the parallel degrees: ``tp * pp * dp_shard * dp_replicate``.
Global batch is ``micro_batch_size * grad_accum_steps * dp_shard * dp_replicate`` sequences.
"""

from __future__ import annotations

from orchestrator.spec.checks import (
    FieldIssue,
    SpecValidationError,
    check_fits_cluster,
    cross_checks,
    spec_warnings,
)
from orchestrator.spec.fields import (
    LOOP_FIELDS,
    LOOP_PARALLELISM,
    MAX_RETRY_RULES,
    PRINTABLE_RE,
    SPEC_VERSION,
    USER_CODE_FAULTS,
    Checkpointing,
    CommHook,
    ConstraintMode,
    DDPOptions,
    Debug,
    Degree,
    Device,
    FaultKind,
    FaultTolerance,
    GPTModel,
    ImportModel,
    InjectFault,
    MoE,
    Parallelism,
    PlacementConstraints,
    PositiveInt,
    PPSchedule,
    Preemption,
    Preflight,
    Resources,
    RetryOn,
    SpecKind,
    SyntheticData,
    TextFileData,
    TokenFileData,
    TopologyLevel,
    Training,
    Watchdog,
    WatchdogAction,
)
from orchestrator.spec.job import (
    JobSpec,
    json_schema,
    parse_spec,
)

__all__ = [
    "SpecKind",
    "Checkpointing",
    "CommHook",
    "ConstraintMode",
    "DDPOptions",
    "Debug",
    "Degree",
    "Device",
    "FaultKind",
    "FaultTolerance",
    "FieldIssue",
    "GPTModel",
    "ImportModel",
    "InjectFault",
    "JobSpec",
    "LOOP_FIELDS",
    "LOOP_PARALLELISM",
    "MAX_RETRY_RULES",
    "MoE",
    "PPSchedule",
    "PRINTABLE_RE",
    "Parallelism",
    "Preemption",
    "PlacementConstraints",
    "PositiveInt",
    "Preflight",
    "Resources",
    "RetryOn",
    "SPEC_VERSION",
    "SpecValidationError",
    "SyntheticData",
    "TextFileData",
    "TokenFileData",
    "TopologyLevel",
    "Training",
    "USER_CODE_FAULTS",
    "Watchdog",
    "WatchdogAction",
    "check_fits_cluster",
    "cross_checks",
    "json_schema",
    "parse_spec",
    "spec_warnings",
]
