"""Training data: synthetic token sequences, a local text file read as bytes, or a token
file (nanoGPT / llm.c .bin, workers/loop/tokens.py: memory-mapped, one contiguous slice per
data-parallel rank).

Every micro-batch is a pure function of (seed, step, micro-step, data shard): a rank reads
its shard (its flattened data-parallel coordinate, ``MeshShape.dp_index``), and the
single-process reference reads every shard in order and concatenates them. So the reference
sees exactly the distributed global batch (``micro_batch_size * grad_accum_steps * dp``
sequences per step), and a resumed run sees exactly what the uninterrupted one saw.

Synthetic sequences are arithmetic progressions modulo the vocabulary (random start and
stride), so the loss visibly falls — convergence checks (PowerSGD) need something learnable.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from orchestrator.spec import JobSpec, TextFileData, TokenFileData
from workers.loop.step_contract import Batch
from workers.loop.tokens import TokenFile

_MASK = (1 << 63) - 1


def _stream_seed(seed: int, step: int, micro: int, shard: int) -> int:
    h = seed
    for v in (step, micro, shard):
        h = (h * 1_000_003 + v + 0x9E3779B9) & _MASK
    return h


class DataSource:
    """``batches(step)`` -> one :class:`Batch` per gradient-accumulation micro-step."""

    def __init__(self, spec: JobSpec, *, seed: int, shards: Sequence[int], vocab_size: int,
                 seq_len: int, device: torch.device, num_shards: int | None = None) -> None:
        self._micro = spec.training.micro_batch_size
        self._accum = spec.training.grad_accum_steps
        self._seed = seed
        self._shards = list(shards)
        self._vocab = vocab_size
        self._seq = seq_len
        self._device = device
        self._text: torch.Tensor | None = None
        if isinstance(spec.data, TextFileData):
            self._text = _load_text(spec.data.path, seq_len=seq_len, vocab_size=vocab_size)
        self._tokens: TokenFile | None = None
        self._num_shards = num_shards or max(self._shards, default=0) + 1
        if isinstance(spec.data, TokenFileData):
            self._tokens = TokenFile.open(spec.data.path, dtype=spec.data.dtype,
                                          header=spec.data.header)
            lo, hi = self._tokens.shard(0, self._num_shards)
            if hi - lo < seq_len + 1:
                raise ValueError(f"data.path {spec.data.path!r} holds {len(self._tokens)} "
                                 f"tokens: {hi - lo} per data-parallel rank, fewer than "
                                 f"seq_len + 1 = {seq_len + 1}")

    def batches(self, step: int) -> list[Batch]:
        out = []
        for micro in range(self._accum):
            rows = torch.cat([self._rows(step, micro, s) for s in self._shards])
            out.append(Batch(inputs=rows[:, :-1].to(self._device),
                             targets=rows[:, 1:].to(self._device)))
        return out

    def _rows(self, step: int, micro: int, shard: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(_stream_seed(self._seed, step, micro, shard))
        n, t = self._micro, self._seq + 1
        if self._tokens is not None:
            lo, hi = self._tokens.shard(shard, self._num_shards)
            starts = torch.randint(lo, hi - t + 1, (n,), generator=g)
            return self._tokens.rows(starts.tolist(), t, vocab_size=self._vocab)
        if self._text is not None:
            starts = torch.randint(0, self._text.numel() - t + 1, (n,), generator=g)
            return torch.stack([self._text[s:s + t] for s in starts.tolist()])
        start = torch.randint(0, self._vocab, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        return (start + stride * torch.arange(t)) % self._vocab


def _load_text(path: str, *, seq_len: int, vocab_size: int) -> torch.Tensor:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"data.path {path!r} is not a readable file on this worker")
    if vocab_size < 256:
        raise ValueError(f"text data is bytes (vocab 256) but the model's vocab_size is "
                         f"{vocab_size}; set model.vocab_size >= 256")
    raw = p.read_bytes()
    if len(raw) < seq_len + 1:
        raise ValueError(f"data.path {path!r} has {len(raw)} bytes; need at least "
                         f"seq_len + 1 = {seq_len + 1}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.long)
