"""Token files as the field writes them: a flat array of uint16 / uint32 token ids, nanoGPT's
`train.bin` (no header) or llm.c's (a 256 x int32 header: magic 20240520, version 1 = uint16
GPT-2 ids / 2 = uint32, token count; the ids from byte 1024 on). Memory-mapped, never read
whole.

`TokenFile.shard(s, n)` is the s-th of n contiguous, equal slices: data-parallel rank s reads
only its own slice, and a sequence never crosses into a neighbour's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

LLMC_MAGIC = 20240520
LLMC_HEADER_BYTES = 256 * 4
LLMC_DTYPES = {1: np.uint16, 2: np.uint32}
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class TokenFileError(ValueError):
    pass


def _read_header(path: Path) -> np.ndarray | None:
    with open(path, "rb") as f:
        raw = f.read(LLMC_HEADER_BYTES)
    if len(raw) < LLMC_HEADER_BYTES:
        return None
    head = np.frombuffer(raw, dtype=np.int32)
    return head if int(head[0]) == LLMC_MAGIC else None


@dataclass(frozen=True)
class TokenFile:
    path: Path
    tokens: np.memmap

    @classmethod
    def open(cls, path: str, *, dtype: str = "auto", header: str = "auto") -> TokenFile:
        p = Path(path)
        if not p.is_file():
            raise TokenFileError(f"data.path {path!r} is not a readable file on this worker")
        head = _read_header(p) if header != "none" else None
        if header == "llmc" and head is None:
            raise TokenFileError(f"{path}: no llm.c header (magic {LLMC_MAGIC}); set "
                                 "data.header: none for a headerless nanoGPT file")
        offset, width = 0, DTYPES.get(dtype)
        if head is not None:
            version = int(head[1])
            if version not in LLMC_DTYPES:
                raise TokenFileError(f"{path}: llm.c header version {version} is unknown "
                                     "(1: uint16, 2: uint32)")
            offset = LLMC_HEADER_BYTES
            width = width or LLMC_DTYPES[version]
            if width != LLMC_DTYPES[version]:
                raise TokenFileError(f"{path}: the header says version {version} "
                                     f"({np.dtype(LLMC_DTYPES[version]).name}) but data.dtype "
                                     f"is {dtype}; use auto")
        width = width or np.uint16
        size = p.stat().st_size - offset
        if size % np.dtype(width).itemsize:
            raise TokenFileError(f"{path}: {size} bytes is not a whole number of "
                                 f"{np.dtype(width).name} tokens; check data.dtype")
        tokens = np.memmap(p, dtype=width, mode="r", offset=offset)
        if head is not None and int(head[2]) != tokens.size:
            raise TokenFileError(f"{path}: the header counts {int(head[2])} tokens, the file "
                                 f"holds {tokens.size}; the file is truncated or damaged")
        return cls(path=p, tokens=tokens)

    def __len__(self) -> int:
        return int(self.tokens.size)

    def shard(self, index: int, count: int) -> tuple[int, int]:
        """[start, end) of shard `index` of `count` equal contiguous slices."""
        per = len(self) // count
        return index * per, (index + 1) * per

    def rows(self, starts: list[int], length: int, *, vocab_size: int) -> torch.Tensor:
        out = torch.from_numpy(np.stack([np.asarray(self.tokens[s:s + length], dtype=np.int64)
                                         for s in starts]))
        top = int(out.max())
        if top >= vocab_size:
            raise TokenFileError(f"token id {top} in {self.path} is >= model.vocab_size="
                                 f"{vocab_size}; set the model's vocab_size to the tokenizer's "
                                 "(GPT-2: 50257)")
        return out
