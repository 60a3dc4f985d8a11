"""Hugging Face transformers -> meshyard, one line:

    trainer = Trainer(..., callbacks=[MeshyardCallback()])

Every `Trainer` log (loss, learning_rate, eval_*) becomes a job metric (one report per global
step), and every checkpoint the Trainer saves (`output_dir/checkpoint-<step>`) a meshyard
checkpoint: every rank reports the saved step, rank 0 with the directory, so a restarted attempt
finds it; `resume_path()` is the directory to pass to `trainer.train(resume_from_checkpoint=...)`.
Needs `transformers` (`meshyard[hf]`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from meshyard.integrations._steps import StepReports
from meshyard.train import get_checkpoint


def resume_path() -> str | None:
    """The job's newest complete checkpoint directory (None on a fresh start)."""
    ckpt = get_checkpoint()
    return ckpt.path if ckpt is not None else None


class MeshyardCallback(TrainerCallback):
    def __init__(self) -> None:
        self._steps = StepReports()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if state.is_world_process_zero and logs:
            self._steps.add(logs, state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        mine = state.is_world_process_zero and path.is_dir()
        self._steps.checkpoint(state.global_step, path if mine else None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps.flush()


__all__ = ["MeshyardCallback", "resume_path"]
