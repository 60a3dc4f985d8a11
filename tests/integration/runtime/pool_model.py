"""A user model that leaves traces in its process (an env var, module state), so the warm
pool test can tell whether a reused worker still carries the previous job's state."""

from __future__ import annotations

import os

from torch import nn

BUILDS = {"count": 0}
MARK = "MESHYARD_TEST_POOL_POLLUTION"


class Tiny(nn.Module):
    def __init__(self, vocab_size: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def forward(self, tokens):  # noqa: ANN001, ANN201
        return self.head(self.emb(tokens))


def build(vocab_size: int = 64, d: int = 16, expect_clean: bool = False,
          record_dir: str | None = None) -> nn.Module:
    if record_dir is not None:  # what this rank's process sees: its GPUs, its rank
        import json

        import ray

        rank = os.environ["RANK"]
        seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK",
                                                "LOCAL_WORLD_SIZE", "WORLD_SIZE")}
        seen["ray_gpu_ids"] = [int(g) for g in ray.get_gpu_ids()]
        with open(os.path.join(record_dir, f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)
    if expect_clean and (os.environ.get(MARK) or BUILDS["count"]):
        raise RuntimeError(f"state leaked from a previous job: env={os.environ.get(MARK)!r} "
                           f"builds={BUILDS['count']}")
    os.environ[MARK] = "1"
    BUILDS["count"] += 1
    return Tiny(vocab_size, d)
