"""The `entrypoint` block of a JobSpec: the user's own training code instead of the built-in
loop. Pure module (pydantic + stdlib).

    entrypoint:
      command: ["python", "train.py", "--config", "small.toml"]   # run once per rank
      # or, instead of command:
      function: "train:train_loop_per_worker"   # called in each rank with `config`
      config: {lr: 0.0003, epochs: 2}
      working_dir: package:sha256:<64 hex>      # uploaded code, or /abs/path on every node
      env: {WANDB_MODE: offline}

The rank's torchrun-compatible variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) and meshyard's
own (MESHYARD_*) are set by meshyard: `env` may not name them (`RESERVED_ENV`).

>>> Entrypoint(command=("python", "train.py")).kind
'command'
>>> package_digest("package:sha256:" + "ab" * 32) == "ab" * 32
True
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.bounds import limits as lim
from orchestrator.usercode.launchers import launcher_problem

IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
PACKAGE_PREFIX = "package:sha256:"
PACKAGE_RE = re.compile(r"^package:sha256:([0-9a-f]{64})$")
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_ARGS = 256
MAX_ARG_CHARS = 4096
MAX_ENV_VARS = 256
MAX_ENV_VALUE_CHARS = 32 * 1024
MAX_PATH_CHARS = 4096

# What meshyard sets in every rank process (torchrun's names, then meshyard's own).
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES")
RESERVED_ENV = frozenset(TORCHRUN_ENV)
RESERVED_ENV_PREFIX = "MESHYARD_"

Arg = Annotated[str, Field(max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")]
EnvValue = Annotated[str, Field(max_length=MAX_ENV_VALUE_CHARS, pattern=r"^[^\x00]*$")]


REDACTED = "***"


def redact_env(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored spec as shown to anyone but an admin: every `entrypoint.env` value `***`
    (the names kept). The stored spec keeps the values: the ranks need them.

    >>> redact_env({"entrypoint": {"env": {"WANDB_API_KEY": "k"}}})
    {'entrypoint': {'env': {'WANDB_API_KEY': '***'}}}
    """
    entry = spec.get("entrypoint")
    if not isinstance(entry, dict) or not isinstance(entry.get("env"), dict):
        return spec
    return {**spec, "entrypoint": {**entry, "env": dict.fromkeys(entry["env"], REDACTED)}}


def package_ref(digest: str) -> str:
    """The `working_dir` value naming an uploaded package by its SHA-256."""
    return PACKAGE_PREFIX + digest


def package_digest(working_dir: str | None) -> str | None:
    """The SHA-256 of a `package:sha256:...` working dir; None for a path (or none)."""
    m = PACKAGE_RE.match(working_dir or "")
    return m.group(1) if m else None


class Entrypoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    command: tuple[Arg, ...] | None = Field(
        default=None, min_length=1, max_length=MAX_ARGS,
        description="Argument list run once per rank, without a shell, e.g. [python, train.py, "
        "--lr, '3e-4']. `python` / `python3` run the workers' interpreter (the one with torch "
        "and meshyard installed).")
    function: str | None = Field(
        default=None, pattern=IMPORT_PATH_RE.pattern, max_length=lim.MAX_NAME_CHARS,
        description="`module:function` importable from the working dir, called once per rank "
        "with `config` after the default process group exists (Ray Train's "
        "train_loop_per_worker).")
    config: dict[str, Any] = Field(
        default_factory=dict, description="The argument `function` is called with (JSON).")
    working_dir: str | None = Field(
        default=None, min_length=1, max_length=MAX_PATH_CHARS, pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Where the code is: `package:sha256:<hex>` (uploaded with `meshyard "
        "submit --working-dir DIR` or POST /v1/packages) or an absolute path every node can "
        "read, under a working-dir root (MESHYARD_WORKING_DIR_ROOTS). Each rank runs in it.")
    env: dict[Annotated[str, Field(max_length=200, pattern=ENV_NAME_RE)], EnvValue] = Field(
        default_factory=dict, max_length=MAX_ENV_VARS,
        description="Extra environment variables for every rank (not RANK, WORLD_SIZE, ... or "
        "MESHYARD_*: meshyard sets those). PYTHONPATH entries go after the working dir. "
        "Write-only: the API, the dashboard and the CLI show each value as *** to everyone "
        "but admins, the job's owner included.")
    steps: int | None = Field(
        default=None, ge=1, le=lim.MAX_STEPS,
        description="Steps the code will report (progress displays only; optional).")

    @field_validator("command", mode="before")
    @classmethod
    def _command_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("command must be a list of arguments, e.g. [\"python\", "
                             "\"train.py\"] (it is not split by a shell); got a string")
        return value

    @field_validator("command")
    @classmethod
    def _not_a_launcher(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        problem = launcher_problem(value) if value else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        taken = sorted(k for k in value if k in RESERVED_ENV or k.startswith(RESERVED_ENV_PREFIX))
        if taken:
            raise ValueError(f"{taken} are set by meshyard for every rank; remove them from "
                             "entrypoint.env (the script reads them as under torchrun)")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Entrypoint:
        if (self.command is None) == (self.function is None):
            raise ValueError("give exactly one of command (a list of arguments run per rank) "
                             "or function (`module:function` called per rank)")
        if self.config and self.function is None:
            raise ValueError("config is the argument of function; a command takes its own "
                             "arguments in the list")
        wd = self.working_dir
        if wd is not None and package_digest(wd) is None and not wd.startswith("/"):
            raise ValueError(f"working_dir {wd!r} must be package:sha256:<hex> or an absolute "
                             "path; to ship a local directory run `meshyard submit SPEC "
                             "--working-dir DIR`")
        return self

    @property
    def kind(self) -> str:
        return "command" if self.command is not None else "function"

    @property
    def package(self) -> str | None:
        """SHA-256 of the uploaded package this job runs, if any."""
        return package_digest(self.working_dir)

    @property
    def module(self) -> str | None:
        return self.function.partition(":")[0] if self.function else None
