"""Upper bounds on the numbers a request may carry, and the column ranges they land in.

Pure. Every bound is above what a real job or cluster needs and low enough that checking a
request stays cheap: no request can make the server allocate a table that grows with a number
it chose, loop up to it, or overflow the database column the number is stored in.

>>> divisors(12)
[1, 2, 3, 4, 6, 12]
"""

from __future__ import annotations

import math

INT32_MAX = 2**31 - 1  # PostgreSQL INTEGER (SQLAlchemy Integer): ranks, attempts, steps
INT64_MAX = 2**63 - 1  # BIGINT / SQLite INTEGER: event, log line and job sequence ids

MAX_WORLD_SIZE = 65_536  # ranks of one job
MAX_LAYERS = 1024
MAX_HIDDEN = 65_536  # d_model
MAX_FFN = 1_048_576  # MLP inner size
MAX_VOCAB = 1_048_576
MAX_SEQ_LEN = 1_048_576
MAX_BATCH = 1_048_576  # sequences: micro batch, global batch
MAX_ACCUM_STEPS = 65_536
MAX_STEPS = 100_000_000  # optimizer steps; also checkpoint intervals and fault steps
MAX_SEED = 2**32 - 1  # numpy's legacy seeding range, which every data loader accepts
MAX_PARAMS = 10**15  # parameters of a model in a plan request

MAX_GPUS_PER_NODE = 64  # a declared node; larger NVLink domains span nodes (nvlink_domain)
MAX_CLUSTER_NODES = 4096  # nodes in a declared cluster carried by a request
MAX_CLUSTER_GPUS = 65_536
MAX_TOPO_M_CHARS = 64 * 1024  # one node's `nvidia-smi topo -m` text (8 GPUs: ~2 KiB)
MAX_NAME_CHARS = 200  # job, node and label names


def divisors(n: int) -> list[int]:
    """Divisors of n >= 1 in increasing order, in O(sqrt n) steps."""
    if n < 1:
        raise ValueError(f"divisors of {n}: n must be >= 1")
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]
