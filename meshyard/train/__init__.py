"""Ray Train's names for a user's own training code, so a Ray Train loop ports by changing
imports only (`ray.train` -> `meshyard.train`, `ray.train.torch` -> `meshyard.train.torch`).

    import meshyard.train
    ctx = meshyard.train.get_context()            # ranks, sizes, and the job's mesh
    ckpt = meshyard.train.get_checkpoint()        # newest complete checkpoint, None if fresh
    meshyard.train.report({"step": 3, "loss": 0.9},
                          checkpoint=meshyard.train.Checkpoint.from_directory(tmp))

Reports become the job's metrics (API, dashboard); like Ray Train, every rank calls `report`
the same number of times, and a reported checkpoint is what a restart resumes from once every
rank has reported its step. Outside a meshyard job (plain `torchrun`) the context comes from
torchrun's variables and reports are kept in this process only.
"""

from meshyard.train._checkpoint import Checkpoint
from meshyard.train._context import TrainContext, get_context
from meshyard.train._report import get_checkpoint, report

__all__ = ["Checkpoint", "TrainContext", "get_checkpoint", "get_context", "report"]
