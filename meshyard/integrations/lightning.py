"""PyTorch Lightning -> meshyard, one line:

    trainer = Trainer(logger=MeshyardLogger(), callbacks=[MeshyardCheckpointHook()], ...)

`MeshyardLogger` makes every `self.log` value a job metric (one report per global step, keys
with `/` written `_`). `MeshyardCheckpointHook` makes every checkpoint that Lightning saves (its
ModelCheckpoint's `.ckpt`) a meshyard checkpoint: every rank reports the saved step, rank 0 with
the file, so a restarted attempt finds it; `resume_path()` is the `.ckpt` to pass to
`trainer.fit(model, ckpt_path=resume_path())`. Needs `lightning` (`meshyard[lightning]`).
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback
from lightning.pytorch.loggers.logger import Logger

from meshyard.integrations._steps import StepReports
from meshyard.train import get_checkpoint, get_context

_STEPS = StepReports()  # one per process: the logger's values join the hook's checkpoint


def resume_path() -> str | None:
    """The `.ckpt` of the job's newest complete checkpoint (None on a fresh start)."""
    ckpt = get_checkpoint()
    if ckpt is None:
        return None
    found = sorted(Path(ckpt.path).glob("*.ckpt"))
    return str(found[-1]) if found else None


class MeshyardLogger(Logger):
    """A Lightning logger whose metrics go to meshyard (Lightning calls it on rank 0)."""

    def __init__(self, name: str = "meshyard") -> None:
        super().__init__()
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str:
        return str(get_context().get_attempt())

    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any,
                        **kwargs: Any) -> None:
        """Hyperparameters are the job spec's `config`: nothing to report."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        _STEPS.add(metrics, step if step is not None else (_STEPS.step or 0))

    def finalize(self, status: str) -> None:
        _STEPS.flush()


class MeshyardCheckpointHook(Callback):
    """Reports each checkpoint Lightning saved, on every rank, at the first hook after the
    save (the file is written then)."""

    def __init__(self) -> None:
        self._pending: int | None = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any,
                           checkpoint: dict[str, Any]) -> None:
        self._pending = trainer.global_step

    def _report(self, trainer: Any) -> None:
        if self._pending is None:
            return
        step, self._pending = self._pending, None
        cb = trainer.checkpoint_callback
        path = (getattr(cb, "_last_checkpoint_saved", "") or getattr(cb, "last_model_path", "")
                or getattr(cb, "best_model_path", "")) if cb is not None else ""
        mine = trainer.is_global_zero and path and Path(path).is_file()
        _STEPS.checkpoint(step, Path(path) if mine else None)

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self._report(trainer)

    def on_train_epoch_start(self, trainer: Any, *args: Any) -> None:
        self._report(trainer)

    def on_validation_start(self, trainer: Any, *args: Any) -> None:
        self._report(trainer)

    def on_fit_end(self, trainer: Any, *args: Any) -> None:
        self._report(trainer)
        _STEPS.flush()
