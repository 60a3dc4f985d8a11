"""Mesh coordinate math (row-major pp, dp_replicate, dp_shard, tp)."""

import pytest

from orchestrator.mesh import MeshShape
from orchestrator.placement.blocks import block_sizes


def test_docstring_example() -> None:
    m = MeshShape(pp=2, dp_replicate=1, dp_shard=2, tp=2)
    assert m.world_size == 8 and m.n_tp_groups == 4
    assert m.coords(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "tp": 1}
    assert m.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert m.groups("dp_shard") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert m.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert m.groups("dp_replicate") == [(r,) for r in range(8)]


def test_coords_round_trip_and_strides() -> None:
    m = MeshShape(pp=3, dp_replicate=2, dp_shard=4, tp=2)
    assert [m.stride(d) for d in ("pp", "dp_replicate", "dp_shard", "tp")] == [16, 8, 2, 1]
    assert all(m.rank_of(m.coords(r)) == r for r in range(m.world_size))
    for dim in ("pp", "dp_replicate", "dp_shard", "tp"):
        groups = m.groups(dim)
        assert sorted(r for g in groups for r in g) == list(range(m.world_size))
        for g in groups:
            others = [{k: v for k, v in m.coords(r).items() if k != dim} for r in g]
            assert all(o == others[0] for o in others)
            assert [m.coords(r)[dim] for r in g] == list(range(getattr(m, dim)))


def test_invalid_degrees() -> None:
    with pytest.raises(ValueError, match="tp=0"):
        MeshShape(tp=0)
    with pytest.raises(ValueError, match="outside"):
        MeshShape(tp=2).coords(2)


def test_block_sizes() -> None:
    assert block_sizes(MeshShape(tp=8, pp=4, dp_shard=8, dp_replicate=4)) == [1, 8, 32]
    assert block_sizes(MeshShape(tp=8, dp_replicate=2)) == [1]
    assert block_sizes(MeshShape(dp_shard=8, dp_replicate=4)) == [1, 8]
