"""ParallelDims and the DeviceMesh built from it.

Mesh dimension order is (pp, dp_replicate, dp_shard, tp), row-major: tp varies fastest and pp
slowest (the Megatron / torchtitan convention the placement solver also assumes). Worked
example, pp=2, dp_replicate=1, dp_shard=2, tp=2 (world 8)::

    rank:  0  1  2  3  4  5  6  7
    pp:    0  0  0  0  1  1  1  1
    dp_sh: 0  0  1  1  0  0  1  1
    tp:    0  1  0  1  0  1  0  1

so TP groups are {0,1} {2,3} ..., FSDP groups {0,2} {1,3} {4,6} {5,7}, PP groups {0,4} {1,5} ...
The flattened data-parallel coordinate is ``dp_replicate_coord * dp_shard + dp_shard_coord``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from orchestrator.spec import JobSpec

DIM_NAMES: tuple[str, str, str, str] = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class ParallelDims:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for name in DIM_NAMES:
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"parallel degree {name}={v!r} must be an integer >= 1")

    @classmethod
    def from_spec(cls, spec: JobSpec) -> ParallelDims:
        p = spec.parallelism
        return cls(pp=p.pp, dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, tp=p.tp)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.tp)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def validate_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ValueError(
                f"world size {world_size} != pp*dp_replicate*dp_shard*tp = "
                f"{self.pp}*{self.dp_replicate}*{self.dp_shard}*{self.tp} = {self.world_size}; "
                f"launch {self.world_size} processes or change the parallel degrees"
            )

    def coords(self, rank: int) -> dict[str, int]:
        """Global rank -> coordinate per dimension.

        >>> ParallelDims(pp=2, dp_shard=2, tp=2).coords(5)
        {'pp': 1, 'dp_replicate': 0, 'dp_shard': 0, 'tp': 1}
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size}")
        out: dict[str, int] = {}
        rest = rank
        for name, size in reversed(list(zip(DIM_NAMES, self.shape, strict=True))):
            out[name] = rest % size
            rest //= size
        return {n: out[n] for n in DIM_NAMES}

    def rank_of(self, *, pp: int = 0, dp_replicate: int = 0, dp_shard: int = 0, tp: int = 0) -> int:
        """Coordinate -> global rank (inverse of :meth:`coords`)."""
        c = (pp, dp_replicate, dp_shard, tp)
        for name, v, size in zip(DIM_NAMES, c, self.shape, strict=True):
            if not 0 <= v < size:
                raise ValueError(f"{name}={v} outside 0..{size - 1}")
        r = 0
        for v, size in zip(c, self.shape, strict=True):
            r = r * size + v
        return r

    def dp_index(self, rank: int) -> int:
        """Flattened data-parallel coordinate: which data shard this rank reads."""
        c = self.coords(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def group_ranks(self, dim: str, rank: int) -> list[int]:
        """Global ranks in ``rank``'s group along ``dim`` (one of DIM_NAMES)."""
        if dim not in DIM_NAMES:
            raise ValueError(f"unknown mesh dim {dim!r}; one of {DIM_NAMES}")
        c = self.coords(rank)
        size = self.shape[DIM_NAMES.index(dim)]
        return [self.rank_of(**{**c, dim: i}) for i in range(size)]


def build_mesh(dims: ParallelDims, *, device_type: str) -> DeviceMesh:
    """DeviceMesh with dims (pp, dp_replicate, dp_shard, tp) plus a flattened "dp".

    Needs the default process group (or world size 1). All four names always exist, so
    callers slice ``mesh["tp"]`` without checking which degrees are > 1.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size() if dist.is_initialized() else 1
    dims.validate_world(world)
    mesh = init_device_mesh(device_type, dims.shape, mesh_dim_names=DIM_NAMES)
    mesh["dp_replicate", "dp_shard"]._flatten("dp")
    return mesh
