"""ParallelDims: validation and rank <-> coordinate math (mesh order pp, dp_replicate, dp_shard, tp)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.mesh import ParallelDims

dims_st = st.builds(ParallelDims, pp=st.integers(1, 4), dp_replicate=st.integers(1, 3),
                    dp_shard=st.integers(1, 4), tp=st.integers(1, 4))


def test_worked_example_from_docstring() -> None:
    d = ParallelDims(pp=2, dp_shard=2, tp=2)
    assert [d.coords(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.coords(r)["dp_shard"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [d.coords(r)["tp"] for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert d.group_ranks("tp", 2) == [2, 3]
    assert d.group_ranks("dp_shard", 1) == [1, 3]
    assert d.group_ranks("pp", 1) == [1, 5]


@given(dims_st, st.data())
def test_coords_round_trip(dims: ParallelDims, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, dims.world_size - 1))
    assert dims.rank_of(**dims.coords(rank)) == rank


@given(dims_st)
def test_dp_index_covers_every_shard_once_per_model_replica(dims: ParallelDims) -> None:
    # Ranks with the same (pp, tp) coordinate read distinct data shards 0..dp-1.
    first = [r for r in range(dims.world_size)
             if dims.coords(r)["pp"] == 0 and dims.coords(r)["tp"] == 0]
    assert sorted(dims.dp_index(r) for r in first) == list(range(dims.dp))
    # TP peers read the same shard.
    for r in range(dims.world_size):
        assert {dims.dp_index(p) for p in dims.group_ranks("tp", r)} == {dims.dp_index(r)}


@given(dims_st)
def test_groups_partition_the_world(dims: ParallelDims) -> None:
    for dim in ("pp", "dp_replicate", "dp_shard", "tp"):
        groups = {tuple(dims.group_ranks(dim, r)) for r in range(dims.world_size)}
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(dims.world_size))


def test_validation_messages() -> None:
    with pytest.raises(ValueError, match="tp=0"):
        ParallelDims(tp=0)
    with pytest.raises(ValueError, match="launch 4 processes"):
        ParallelDims(dp_shard=2, tp=2).validate_world(2)
    with pytest.raises(ValueError, match="unknown mesh dim"):
        ParallelDims().group_ranks("cp", 0)
    with pytest.raises(ValueError, match="outside world"):
        ParallelDims(tp=2).coords(2)
