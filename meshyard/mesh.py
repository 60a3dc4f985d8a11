"""The rank <-> mesh-coordinates contract: dimension order (pp, dp_replicate, dp_shard, ep, cp,
tp), row-major. The solver, the runtime, the watchdog, the workers and user code's
`meshyard.train` all use this one module (the control plane through `orchestrator.mesh`).

tp varies fastest and pp slowest (the Megatron / torchtitan convention), so

    rank = ((((pp * dp_replicate_size + dp_replicate) * dp_shard_size + dp_shard) * ep_size
             + ep) * cp_size + cp) * tp_size + tp

ep (expert parallel) is a data dimension: each ep rank reads its own data shard and the MoE
layers exchange tokens with all-to-all inside the ep group; the non-expert parameters are
data-parallel over dp_shard x ep. cp (context parallel) ranks read the same batch and split
its sequence. Both sit inside the data-parallel dims, next to tp, so that their groups are
runs of nearby ranks (what the solver keeps inside an NVLink domain).

Pure module (stdlib only).

Example, MeshShape(pp=2, dp_replicate=1, dp_shard=2, tp=2) (world 8):

    rank:  0  1  2  3  4  5  6  7
    pp:    0  0  0  0  1  1  1  1
    dp_sh: 0  0  1  1  0  0  1  1
    tp:    0  1  0  1  0  1  0  1

    rank 5 -> {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "ep": 0, "cp": 0, "tp": 1}
    groups("tp")       == [(0, 1), (2, 3), (4, 5), (6, 7)]
    groups("dp_shard") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    groups("pp")       == [(0, 4), (1, 5), (2, 6), (3, 7)]

The flattened data coordinate (which data shard a rank reads) is
``(dp_replicate * dp_shard_size + dp_shard) * ep_size + ep``: `dp_index`, one of
`data_shards` = dp_replicate * dp_shard * ep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

DIMS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "ep", "cp", "tp")


@dataclass(frozen=True)
class MeshShape:
    """Parallel degrees of a job. The product is the world size."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    ep: int = 1
    cp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for dim in DIMS:
            value = getattr(self, dim)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{dim}={value!r}: every parallel degree must be an integer >= 1")

    @classmethod
    def from_parallelism(cls, parallelism: Any) -> MeshShape:
        """From anything with the degrees as attributes (e.g. spec.Parallelism); ep and cp
        default to 1 when absent."""
        return cls(pp=parallelism.pp, dp_replicate=parallelism.dp_replicate,
                   dp_shard=parallelism.dp_shard, ep=getattr(parallelism, "ep", 1),
                   cp=getattr(parallelism, "cp", 1), tp=parallelism.tp)

    @classmethod
    def from_degrees(cls, degrees: Mapping[str, Any]) -> MeshShape:
        """From a mapping holding some of the degrees (the others are 1)."""
        return cls(**{d: int(degrees.get(d, 1)) for d in DIMS})

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in DIMS)

    @property
    def world_size(self) -> int:
        out = 1
        for size in self.sizes:
            out *= size
        return out

    @property
    def dp(self) -> int:
        """Data-parallel degree of the dense wrappers: dp_replicate * dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def data_shards(self) -> int:
        """Ranks reading distinct data: dp_replicate * dp_shard * ep."""
        return self.dp * self.ep

    @property
    def n_tp_groups(self) -> int:
        return self.world_size // self.tp

    def validate_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            names = "*".join(DIMS)
            values = "*".join(str(v) for v in self.sizes)
            raise ValueError(
                f"world size {world_size} != {names} = {values} = {self.world_size}; "
                f"launch {self.world_size} processes or change the parallel degrees")

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours along `dim` (tp: 1, dp_shard: tp, ...)."""
        i = DIMS.index(dim)
        out = 1
        for size in self.sizes[i + 1:]:
            out *= size
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Global rank -> coordinate per dimension.

        >>> MeshShape(pp=2, dp_shard=2, tp=2).coords(5)
        {'pp': 1, 'dp_replicate': 0, 'dp_shard': 0, 'ep': 0, 'cp': 0, 'tp': 1}
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world size {self.world_size}")
        out: dict[str, int] = {}
        for dim in reversed(DIMS):
            rank, out[dim] = divmod(rank, getattr(self, dim))
        return {d: out[d] for d in DIMS}

    def rank_of(self, coords: Mapping[str, int]) -> int:
        """Coordinates -> global rank (inverse of `coords`; missing dimensions are 0)."""
        rank = 0
        for dim in DIMS:
            value = coords.get(dim, 0)
            if not 0 <= value < getattr(self, dim):
                raise ValueError(f"{dim}={value} outside 0..{getattr(self, dim) - 1}")
            rank += value * self.stride(dim)
        return rank

    def dp_index(self, rank: int) -> int:
        """Flattened data coordinate: which of `data_shards` this rank reads."""
        c = self.coords(rank)
        return (c["dp_replicate"] * self.dp_shard + c["dp_shard"]) * self.ep + c["ep"]

    def group_ranks(self, dim: str, rank: int) -> list[int]:
        """Global ranks in `rank`'s group along `dim`, ascending."""
        if dim not in DIMS:
            raise ValueError(f"unknown mesh dim {dim!r}; one of {DIMS}")
        c = self.coords(rank)
        return [self.rank_of({**c, dim: i}) for i in range(getattr(self, dim))]

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        """Rank groups that differ only along `dim`, each ascending, ordered by first rank."""
        return list(_groups(self, dim))

    def as_dict(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in DIMS}


@lru_cache(maxsize=256)
def _groups(mesh: MeshShape, dim: str) -> tuple[tuple[int, ...], ...]:
    size, stride = getattr(mesh, dim), mesh.stride(dim)
    block = size * stride
    return tuple(tuple(base + i * stride for i in range(size))
                 for base in range(mesh.world_size) if (base % block) < stride)


class Degrees:
    """For anything that holds the six degrees as attributes (a spec's parallelism, a
    planner candidate): its `mesh`, and the sizes only the mesh computes."""

    __slots__ = ()

    @property
    def mesh(self) -> MeshShape:
        return MeshShape.from_parallelism(self)

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def dp(self) -> int:
        return self.mesh.dp

    @property
    def data_shards(self) -> int:
        """Ranks reading distinct data (expert-parallel ranks each read their own)."""
        return self.mesh.data_shards

