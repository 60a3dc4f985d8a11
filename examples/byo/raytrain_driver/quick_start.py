"""A Ray Train program in the shape of Ray's PyTorch quick start (an image classifier, one
process first, then distributed with TorchTrainer), on synthetic 28x28 images instead of a
download; ported by its import lines only."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def get_dataset(n=512):
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(n, 1, 28, 28, generator=gen)
    labels = (images.mean(dim=(1, 2, 3)) * 10).long().clamp(0, 9)
    return TensorDataset(images, labels)


class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.layers = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, inputs):
        return self.layers(self.flatten(inputs))


def train_func():
    dataloader = DataLoader(get_dataset(), batch_size=64)
    model = NeuralNetwork()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for inputs, labels in dataloader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch: {epoch}, loss: {loss.item()}")


from meshyard import train  # noqa: E402


def train_func_distributed():
    dataloader = DataLoader(get_dataset(), batch_size=64)
    dataloader = train.torch.prepare_data_loader(dataloader)
    model = train.torch.prepare_model(NeuralNetwork())
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for inputs, labels in dataloader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch: {epoch}, loss: {loss.item()}")


if __name__ == "__main__":
    train_func()

    from meshyard.train import ScalingConfig
    from meshyard.train.torch import TorchTrainer

    use_gpu = False
    trainer = TorchTrainer(
        train_func_distributed,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=use_gpu),
    )
    results = trainer.fit()
    print("world size", 2, "error", results.error)
