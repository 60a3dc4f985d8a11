"""A user model for `model: {kind: import, path: tests.integration.workers.user_model:build}`."""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        h = h + self.fc2(torch.relu(self.fc1(h)))
        return self.head(h)


def build(vocab_size: int = 128, d: int = 32):  # noqa: ANN201 - returns (module, plan)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return TinyLM(vocab_size, d), {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def build_not_a_module():  # noqa: ANN201
    return 42
