"""Ray Train's PyTorch quickstart loop on meshyard: train_ray.py with its imports changed
(`ray.train` -> `meshyard.train`); spec.yaml takes the place of TorchTrainer.

    meshyard submit spec.yaml --working-dir .
"""

import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import meshyard.train.torch


def make_dataset(n: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(n, 1, 28, 28, generator=g)
    teacher = torch.randn(28 * 28, 10, generator=g)
    return TensorDataset(images, (images.flatten(1) @ teacher).argmax(1))


def train_func(config):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 128), nn.ReLU(), nn.Linear(128, 10))
    model = meshyard.train.torch.prepare_model(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])

    train_loader = DataLoader(make_dataset(), batch_size=config["batch_size"], shuffle=True)
    train_loader = meshyard.train.torch.prepare_data_loader(train_loader)

    for epoch in range(config["epochs"]):
        if meshyard.train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        for images, labels in train_loader:
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            weights = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
            torch.save(weights, os.path.join(temp_checkpoint_dir, "model.pt"))
            meshyard.train.report(
                metrics,
                checkpoint=meshyard.train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        if meshyard.train.get_context().get_world_rank() == 0:
            print(metrics, flush=True)

