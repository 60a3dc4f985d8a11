"""The driver side of Ray Train's API on meshyard: `TorchTrainer(...).fit()` runs the training
function as a meshyard job and returns a `Result`.

    trainer = TorchTrainer(train_func, train_loop_config={"lr": 1e-2},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(name="linear", storage_path="/tmp/results"))
    result = trainer.fit()     # result.metrics, result.checkpoint, result.error

`fit()` names the function by import path (`module:function`, so it must be a module-level
function), ships the directory its module is imported from, submits an `entrypoint: {function,
config}` job with `parallelism: {dp_replicate: num_workers}`, prints every rank's log lines as
they arrive, waits for the end and reads the job's last metrics and newest checkpoint. The
service is the one `MESHYARD_URL` / `MESHYARD_TOKEN` name, or the CLI's (a `server.json` in
`MESHYARD_DATA_DIR`, default `.meshyard`); with neither, `fit()` starts an embedded
`meshyard serve` on 127.0.0.1 for the run and stops it after. The talking to the service runs in
a child process (`python -I -m api.fit`: the CLI's client and packaging), so the caller's own
packages never shadow meshyard's. Standard library only.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshyard import _protocol as proto
from meshyard.train._checkpoint import Checkpoint

DEFAULT_STORAGE = "~/meshyard_results"


class TrainingFailedError(RuntimeError):
    """The job failed; the message leads with the error the job ended with (Ray Train's
    `TrainingFailedError`). `job_id` names the job (`meshyard events <job_id>`)."""

    def __init__(self, message: str, *, job_id: str | None = None,
                 failure_reason: str | None = None) -> None:
        super().__init__(message)
        self.job_id, self.failure_reason = job_id, failure_reason


@dataclass
class ScalingConfig:
    """How many ranks and on what (Ray Train's names). `resources_per_worker` may give "CPU"
    and "GPU" per rank; the job's parallelism is `dp_replicate: num_workers`."""

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    trainer_resources: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"ScalingConfig(num_workers={self.num_workers!r}): give the number "
                             "of ranks, an int >= 1")
        unknown = sorted(set(self.resources_per_worker or {}) - {"CPU", "GPU"})
        if unknown:
            raise ValueError(f"resources_per_worker {unknown}: meshyard places ranks by CPU and "
                             "GPU only; remove the others")


@dataclass
class FailureConfig:
    """Restarts after a failure (the job's `fault_tolerance.max_failures`); none by default,
    as in Ray Train."""

    max_failures: int = 0


@dataclass
class CheckpointConfig:
    """Accepted for Ray Train compatibility; every checkpoint a job reports is kept."""

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"


@dataclass
class RunConfig:
    """The job's name and where results go: `<storage_path>/<name>/` receives a copy of the
    newest checkpoint when the service's files are readable here (always, for the embedded
    service, whose data dir is `<storage_path>/<name>/service`)."""

    name: str | None = None
    storage_path: str | None = None
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    verbose: int = 1


@dataclass
class Result:
    """What `fit()` returns (Ray Train's names): rank 0's last reported metrics (None when it
    reported none), the newest complete checkpoint (None when none), the error (None on
    success), the run's result directory and the job's id."""

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: BaseException | None = None
    path: str | None = None
    job_id: str | None = None
    metrics_history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def best_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        return [(self.checkpoint, self.metrics or {})] if self.checkpoint is not None else []


def function_path(fn: Callable[..., Any]) -> tuple[str, Path]:
    """(`module:function`, the directory that module imports from) for a module-level
    function; ValueError saying what to write otherwise."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not callable(fn) or not name or "." in name or "<" in name:
        raise ValueError(f"the training function {name or fn!r} must be a function defined at "
                         "the top level of a module (meshyard imports it by name in every rank); "
                         "move it out of the class / function / lambda it is in")
    try:
        source = inspect.getsourcefile(fn)
    except TypeError:
        source = None
    if source is None:
        raise ValueError(f"{name} has no source file (defined in an interactive session?); "
                         "put it in a .py file next to the code that calls fit()")
    path = Path(source).resolve()
    module = fn.__module__
    if module == "__main__":
        module = path.stem
        root = path.parent
    else:
        parts = module.split(".")
        root = path.parents[len(parts) - (0 if path.stem == "__init__" else 1)]
    if not module.replace(".", "_").isidentifier():
        raise ValueError(f"the file {path.name} cannot be imported by name ({module!r} is not a "
                         "Python module name); rename it, e.g. to train.py")
    return f"{module}:{fn.__name__}", root


class DataParallelTrainer:
    """Ray Train's trainer on meshyard (see the module doc)."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: Mapping[str, Any] | None = None,
                 scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None,
                 datasets: Mapping[str, Any] | None = None,
                 resume_from_checkpoint: Checkpoint | None = None,
                 **unsupported: Any) -> None:
        if unsupported:
            raise TypeError(f"{type(self).__name__} does not take {sorted(unsupported)} on "
                            "meshyard; remove them")
        if datasets:
            raise ValueError("datasets= (Ray Data) is not supported on meshyard: build the "
                             "DataLoader inside the training function and pass it to "
                             "meshyard.train.torch.prepare_data_loader")
        if resume_from_checkpoint is not None:
            raise ValueError("resume_from_checkpoint= is not supported: a job resumes from its "
                             "own newest checkpoint (meshyard.train.get_checkpoint()) on restart")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = dict(train_loop_config or {})
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()

    def _request(self) -> dict[str, Any]:
        function, root = function_path(self.train_loop_per_worker)
        try:
            json.dumps(self.train_loop_config, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"train_loop_config must be JSON (numbers, strings, lists, dicts): "
                             f"{exc}; pass file paths or names instead of objects") from None
        sc, rc = self.scaling_config, self.run_config
        name = rc.name or function.replace(":", "-").replace(".", "-").replace("_", "-")
        resources: dict[str, Any] = {"device": "cuda" if sc.use_gpu else "cpu"}
        per = sc.resources_per_worker or {}
        if "CPU" in per:
            resources["cpus_per_worker"] = per["CPU"]
        if sc.use_gpu and "GPU" in per:
            resources["gpus_per_worker"] = per["GPU"]
        spec: dict[str, Any] = {
            "name": name[:100], "parallelism": {"dp_replicate": sc.num_workers},
            "resources": resources,
            "entrypoint": {"function": function, "config": self.train_loop_config}}
        failures = rc.failure_config.max_failures if rc.failure_config is not None else 0
        spec["fault_tolerance"] = {"max_failures": failures}  # Ray Train's default: no retry
        storage = Path(os.path.expanduser(rc.storage_path or DEFAULT_STORAGE)).resolve()
        return {"spec": spec, "working_dir": str(root), "results_dir": str(storage / name),
                "verbose": rc.verbose}

    def fit(self) -> Result:
        """Runs the job to its end; returns its Result, or raises TrainingFailedError (with
        the Result's error) when it failed."""
        if os.environ.get(proto.JOB_ID):
            raise RuntimeError("fit() was called inside a rank of a meshyard job: the module "
                               "that defines the training function calls fit() when imported; "
                               "put the driver code under `if __name__ == \"__main__\":`")
        request = self._request()
        with tempfile.TemporaryDirectory(prefix="meshyard-fit-") as tmp:
            req, out = Path(tmp) / "request.json", Path(tmp) / "result.json"
            req.write_text(json.dumps(request))
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            proc = subprocess.run([sys.executable, "-I", "-m", "api.fit", str(req), str(out)],
                                  env=env, check=False)
            if not out.exists():
                raise RuntimeError(f"the meshyard driver exited {proc.returncode} without a "
                                   "result (its error is printed above)")
            info = json.loads(out.read_text())
        return _result(info)


def _result(info: Mapping[str, Any]) -> Result:
    if info.get("setup_error"):
        raise RuntimeError(str(info["setup_error"]))
    ckpt = info.get("checkpoint")
    error = None
    if info.get("state") != "SUCCEEDED":
        error = TrainingFailedError(str(info.get("message") or info.get("state")),
                                    job_id=info.get("job_id"),
                                    failure_reason=info.get("failure_reason"))
    result = Result(metrics=info.get("metrics"), error=error, path=info.get("path"),
                    checkpoint=Checkpoint(path=str(ckpt)) if ckpt else None,
                    job_id=info.get("job_id"), metrics_history=list(info.get("history") or []))
    if error is not None:
        error.result = result  # type: ignore[attr-defined]
        raise error
    return result
