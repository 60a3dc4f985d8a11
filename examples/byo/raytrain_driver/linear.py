"""A Ray Train program in the shape of Ray's linear-regression example, ported by its import
lines only (`ray.train` -> `meshyard.train`): `python linear.py --num-workers 2` runs it as a
meshyard job and prints the final metrics."""

import argparse
import os
import tempfile

import torch
import torch.nn as nn

import meshyard.train as train
from meshyard.train import Checkpoint, RunConfig, ScalingConfig
from meshyard.train.torch import TorchTrainer


class LineData(torch.utils.data.Dataset):
    """Points on y = slope * x + intercept."""

    def __init__(self, slope, intercept, n=1000):
        self.x = torch.linspace(0, 10, n)
        self.y = slope * self.x + intercept

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i, None], self.y[i, None]


def fit_epoch(loader, model, loss_fn, optimizer):
    for x, y in loader:
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def evaluate(loader, model, loss_fn):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += loss_fn(model(x), y).item()
    model.train()
    return total / len(loader)


def train_func(config):
    train_loader = torch.utils.data.DataLoader(LineData(2, 5, config.get("data_size", 1000)),
                                               batch_size=config.get("batch_size", 32))
    val_loader = torch.utils.data.DataLoader(LineData(2, 5, config.get("val_size", 400)),
                                             batch_size=config.get("batch_size", 32))
    train_loader = train.torch.prepare_data_loader(train_loader)
    val_loader = train.torch.prepare_data_loader(val_loader)
    model = train.torch.prepare_model(nn.Linear(1, config.get("hidden_size", 1)))
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))
    for epoch in range(config.get("epochs", 3)):
        fit_epoch(train_loader, model, loss_fn, optimizer)
        metrics = {"loss": evaluate(val_loader, model, loss_fn), "epoch": epoch}
        with tempfile.TemporaryDirectory() as tmp:
            state = {k: v.cpu() for k, v in model.state_dict().items()}
            torch.save(state, os.path.join(tmp, "model.pt"))
            train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))


def train_linear(num_workers=2, use_gpu=False, epochs=3, storage_path=None):
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config={"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
        run_config=RunConfig(name="linear", storage_path=storage_path),
    )
    result = trainer.fit()
    print(result.metrics)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--storage-path", default=None)
    args, _ = parser.parse_known_args()
    train_linear(num_workers=args.num_workers, use_gpu=args.use_gpu, epochs=args.epochs,
                 storage_path=args.storage_path)
