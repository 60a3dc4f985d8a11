"""`meshyard.train`'s context under a job's mesh: its data-parallel rank and size are the
mesh contract's (`MeshShape.dp_index`, `data_shards`) for every layout, and
`prepare_data_loader` shards by them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshyard import _protocol as proto
from meshyard.mesh import DIMS, MeshShape
from meshyard.train import _context
from meshyard.train._context import TrainContext


def _env(mesh: MeshShape, rank: int) -> dict[str, str]:
    # What the worker hands a rank process (workers.usercode.environment.rank_env).
    return {"RANK": str(rank), "WORLD_SIZE": str(mesh.world_size),
            proto.MESH_DIM_NAMES: ",".join(DIMS),
            proto.MESH_SHAPE: ",".join(str(s) for s in mesh.sizes)}


meshes = st.builds(MeshShape, pp=st.integers(1, 3), dp_replicate=st.integers(1, 3),
                   dp_shard=st.integers(1, 3), ep=st.integers(1, 3), cp=st.integers(1, 3),
                   tp=st.integers(1, 3))


@settings(deadline=None, max_examples=150)
@given(meshes)
def test_the_sdk_data_rank_and_size_are_the_mesh_contracts(mesh: MeshShape) -> None:
    for rank in range(mesh.world_size):
        ctx = TrainContext.from_environ(_env(mesh, rank))
        assert ctx.get_dp_rank() == mesh.dp_index(rank), (mesh, rank)
        assert ctx.get_dp_size() == mesh.data_shards, mesh


def test_context_parallel_peers_read_the_same_shard() -> None:
    mesh = MeshShape(dp_shard=2, cp=2)
    ranks = [TrainContext.from_environ(_env(mesh, r)).get_dp_rank() for r in range(4)]
    assert ranks == [0, 0, 1, 1]


def test_outside_meshyard_every_rank_is_data_parallel() -> None:
    ctxs = [TrainContext.from_environ({"RANK": str(r), "WORLD_SIZE": "3"}) for r in range(3)]
    assert [c.get_dp_rank() for c in ctxs] == [0, 1, 2]
    assert {c.get_dp_size() for c in ctxs} == {3}


@pytest.fixture
def context() -> Iterator[list[TrainContext]]:
    saved = list(_context._CONTEXT)
    yield _context._CONTEXT
    _context._CONTEXT[:] = saved


def test_prepare_data_loader_shards_by_the_mesh(context: list[TrainContext]) -> None:
    from torch.utils.data import DataLoader

    from meshyard.train.torch import prepare_data_loader

    mesh = MeshShape(dp_shard=2, ep=2, cp=2)
    for rank in range(mesh.world_size):
        context[:] = [TrainContext.from_environ(_env(mesh, rank))]
        loader = prepare_data_loader(DataLoader(list(range(16)), batch_size=2),
                                     move_to_device=False)
        assert loader.sampler.num_replicas == mesh.data_shards == 4
        assert loader.sampler.rank == mesh.dp_index(rank)
