"""The Lightning logger + checkpoint hook and the transformers callback, with the real packages
on CPU and tiny models built here: what they report is what meshyard's reporting channel
receives (the rank's report file and checkpoint dir, as in a job)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from meshyard import _protocol as proto
from meshyard.train import _report

lightning = pytest.importorskip("lightning", reason="pip install meshyard[lightning]")
transformers = pytest.importorskip("transformers", reason="pip install meshyard[hf]")


@pytest.fixture
def channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    reports, ckpts = tmp_path / "reports.jsonl", tmp_path / "checkpoints"
    ckpts.mkdir()
    monkeypatch.setenv(proto.REPORT_FILE, str(reports))
    monkeypatch.setenv(proto.CHECKPOINT_DIR, str(ckpts))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    _report._STATE.clear()
    yield reports, ckpts
    _report._STATE.clear()


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_lightning_self_log_values_and_checkpoints_reach_meshyard(channel, tmp_path,
                                                                  monkeypatch) -> None:
    from lightning.pytorch import LightningModule, Trainer

    from meshyard.integrations import _steps
    from meshyard.integrations import lightning as integ

    monkeypatch.setattr(integ, "_STEPS", _steps.StepReports())
    reports, ckpts = channel

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = Trainer(max_epochs=2, accelerator="cpu", devices=1, log_every_n_steps=1,
                      logger=integ.MeshyardLogger(), callbacks=[integ.MeshyardCheckpointHook()],
                      default_root_dir=tmp_path / "pl", enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(Tiny(), loader)
    recs = [r for r in _records(reports) if r["kind"] == "report"]
    steps = [r["step"] for r in recs]
    assert steps == sorted(steps)
    # self.log("train/loss") at global steps 0-7 (Lightning logs before the step counts)
    assert [r["step"] for r in recs if "train_loss" in r["metrics"]] == list(range(8))
    saved = [r for r in recs if r["checkpoint"]]
    assert [r["step"] for r in saved] == [4, 8]  # ModelCheckpoint's save after each epoch
    files = list((ckpts / saved[-1]["checkpoint"]).glob("*.ckpt"))
    assert len(files) == 1
    state = torch.load(files[0], weights_only=False)
    assert state["global_step"] == 8 and "layer.weight" in state["state_dict"]


def test_transformers_logs_and_checkpoints_reach_meshyard(channel, tmp_path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from meshyard.integrations.hf import MeshyardCallback

    reports, ckpts = channel
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64,
                                       n_positions=16))
    ids = torch.randint(0, 64, (16, 8))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=6, logging_steps=2,
                             save_steps=3, per_device_train_batch_size=4, report_to=[],
                             use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[MeshyardCallback()]).train()
    recs = [r for r in _records(reports) if r["kind"] == "report"]
    with_loss = [r["step"] for r in recs if "loss" in r["metrics"]]
    assert with_loss == [2, 4, 6]
    assert [r["step"] for r in recs if r["checkpoint"]] == [3, 6]
    assert (ckpts / "step_00000006" / "model.safetensors").is_file()
    assert all(r["metrics"].get("learning_rate") is not None for r in recs if r["step"] == 2)
