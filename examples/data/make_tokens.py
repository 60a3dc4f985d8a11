"""Writes a token file the built-in loop reads (`data: {kind: tokens, path: ...}`), from a
text file, with a small word-level tokenizer (ids in order of first appearance). Real jobs
use their own tokenizer's output; the layout is the same.

    python examples/data/make_tokens.py TEXT OUT.bin [--llmc] [--uint32]

Without --llmc: nanoGPT's layout (the raw ids, uint16). With --llmc: llm.c's, a 256 x int32
header (magic 20240520, version 1 for uint16 / 2 for uint32, token count), then the ids.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

MAGIC = 20240520


def tokenize(text: str) -> tuple[np.ndarray, dict[str, int]]:
    vocab: dict[str, int] = {}
    ids = [vocab.setdefault(w, len(vocab)) for w in re.findall(r"\w+|[^\w\s]", text.lower())]
    return np.array(ids, dtype=np.int64), vocab


def write(ids: np.ndarray, out: Path, *, llmc: bool, uint32: bool) -> None:
    dtype = np.uint32 if uint32 else np.uint16
    with open(out, "wb") as f:
        if llmc:
            header = np.zeros(256, dtype=np.int32)
            header[:3] = (MAGIC, 2 if uint32 else 1, ids.size)
            f.write(header.tobytes())
        f.write(ids.astype(dtype).tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("text", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--llmc", action="store_true", help="write llm.c's header")
    ap.add_argument("--uint32", action="store_true", help="uint32 ids (default uint16)")
    args = ap.parse_args()
    ids, vocab = tokenize(args.text.read_text())
    write(ids, args.out, llmc=args.llmc, uint32=args.uint32)
    print(f"{args.out}: {ids.size} tokens, vocabulary {len(vocab)}")


if __name__ == "__main__":
    main()
