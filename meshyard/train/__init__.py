"""Ray Train's names for a user's own training code, so a Ray Train loop ports by changing
imports only (`ray.train` -> `meshyard.train`, `ray.train.torch` -> `meshyard.train.torch`).

    import meshyard.train
    ctx = meshyard.train.get_context()            # ranks, sizes, and the job's mesh
    ckpt = meshyard.train.get_checkpoint()        # newest complete checkpoint, None if fresh
    meshyard.train.report({"step": 3, "loss": 0.9},
                          checkpoint=meshyard.train.Checkpoint.from_directory(tmp))

The driver is Ray Train's too: `TorchTrainer(train_func, train_loop_config=...,
scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(name=...)).fit()` runs the
function as a meshyard job and returns a `Result` (meshyard/train/_trainer.py);
`meshyard.train.torch` is loaded on first use, so `import meshyard.train` loads no torch.

Reports become the job's metrics (API, dashboard); like Ray Train, every rank calls `report`
the same number of times, and a reported checkpoint is what a restart resumes from once every
rank has reported its step. Outside a meshyard job (plain `torchrun`) the context comes from
torchrun's variables and reports are kept in this process only.
"""

import importlib
from types import ModuleType

from meshyard.train._checkpoint import Checkpoint
from meshyard.train._context import TrainContext, get_context
from meshyard.train._report import get_checkpoint, report
from meshyard.train._trainer import (
    CheckpointConfig,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)

__all__ = ["Checkpoint", "CheckpointConfig", "FailureConfig", "Result", "RunConfig",
           "ScalingConfig", "TrainContext", "TrainingFailedError", "get_checkpoint",
           "get_context", "report"]


def __getattr__(name: str) -> ModuleType:
    """`meshyard.train.torch` as an attribute (Ray Train's `train.torch.prepare_model`)."""
    if name == "torch":
        return importlib.import_module("meshyard.train.torch")
    raise AttributeError(f"module 'meshyard.train' has no attribute {name!r}")
