"""The rank <-> coordinates contract (row-major pp, dp_replicate, dp_shard, tp): validation,
round trips, groups, data-parallel index."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.mesh import MeshShape
from orchestrator.placement.blocks import block_sizes


def test_docstring_example() -> None:
    m = MeshShape(pp=2, dp_replicate=1, dp_shard=2, tp=2)
    assert m.world_size == 8 and m.n_tp_groups == 4
    assert m.coords(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "ep": 0, "cp": 0,
                           "tp": 1}
    assert m.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert m.groups("dp_shard") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert m.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert m.groups("dp_replicate") == [(r,) for r in range(8)]


def test_coords_round_trip_and_strides() -> None:
    m = MeshShape(pp=3, dp_replicate=2, dp_shard=4, tp=2)
    assert [m.stride(d) for d in ("pp", "dp_replicate", "dp_shard", "tp")] == [16, 8, 2, 1]
    e = MeshShape(dp_shard=2, ep=2, cp=2, tp=2)
    assert [e.stride(d) for d in ("dp_shard", "ep", "cp", "tp")] == [8, 4, 2, 1]
    assert e.groups("ep")[:2] == [(0, 4), (1, 5)] and e.groups("cp")[0] == (0, 2)
    assert e.coords(13) == {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "ep": 1, "cp": 0,
                            "tp": 1}
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


dims_st = st.builds(MeshShape, pp=st.integers(1, 4), dp_replicate=st.integers(1, 3),
                    dp_shard=st.integers(1, 4), ep=st.integers(1, 3), cp=st.integers(1, 2),
                    tp=st.integers(1, 4))


def test_worked_example_from_docstring() -> None:
    d = MeshShape(pp=2, dp_shard=2, tp=2)
    assert [d.coords(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.coords(r)["dp_shard"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [d.coords(r)["tp"] for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert d.group_ranks("tp", 2) == [2, 3]
    assert d.group_ranks("dp_shard", 1) == [1, 3]
    assert d.group_ranks("pp", 1) == [1, 5]


@settings(deadline=None)  # a shared 2-core machine: wall time per example varies 10x
@given(dims_st, st.data())
def test_coords_round_trip(dims: MeshShape, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, dims.world_size - 1))
    assert dims.rank_of(dims.coords(rank)) == rank


@settings(deadline=None)
@given(dims_st)
def test_dp_index_covers_every_shard_once_per_model_replica(dims: MeshShape) -> None:
    # Ranks with the same (pp, cp, tp) coordinate read distinct data shards: one per
    # dp_replicate x dp_shard x ep coordinate (expert-parallel ranks read their own data).
    first = [r for r in range(dims.world_size)
             if dims.coords(r)["pp"] == 0 and dims.coords(r)["tp"] == 0
             and dims.coords(r)["cp"] == 0]
    assert sorted(dims.dp_index(r) for r in first) == list(range(dims.data_shards))
    assert dims.data_shards == dims.dp * dims.ep
    # TP and CP peers read the same shard.
    for r in range(dims.world_size):
        for dim in ("tp", "cp"):
            assert {dims.dp_index(p) for p in dims.group_ranks(dim, r)} == {dims.dp_index(r)}


@settings(deadline=None)
@given(dims_st)
def test_groups_partition_the_world(dims: MeshShape) -> None:
    for dim in ("pp", "dp_replicate", "dp_shard", "ep", "cp", "tp"):
        groups = {tuple(dims.group_ranks(dim, r)) for r in range(dims.world_size)}
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(dims.world_size))


def test_validation_messages() -> None:
    with pytest.raises(ValueError, match="tp=0"):
        MeshShape(tp=0)
    with pytest.raises(ValueError, match="launch 4 processes"):
        MeshShape(dp_shard=2, tp=2).validate_world(2)
    with pytest.raises(ValueError, match="unknown mesh dim"):
        MeshShape().group_ranks("xp", 0)
    with pytest.raises(ValueError, match="outside world"):
        MeshShape(tp=2).coords(2)


def test_mesh_coords_tp_fastest():
    assert MeshShape(pp=2, dp_shard=2, tp=2).coords(5) == \
        {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "ep": 0, "cp": 0,
                           "tp": 1}
