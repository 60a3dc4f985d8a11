"""The rank's context: torchrun's variables plus the job's mesh (MESHYARD_MESH_*)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshyard import _protocol as proto

DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class TrainContext:
    world_rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    mesh_names: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    job_id: str | None = None
    attempt: int = 1
    _mesh: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> TrainContext:
        e = os.environ if env is None else env
        world = _int(e, "WORLD_SIZE", 1)
        names = tuple(n for n in e.get(proto.MESH_DIM_NAMES, "").split(",") if n) or DIM_NAMES
        try:
            shape = tuple(int(x) for x in e.get(proto.MESH_SHAPE, "").split(",") if x)
        except ValueError:
            shape = ()
        if len(shape) != len(names):  # not under meshyard: all ranks data-parallel
            names, shape = DIM_NAMES, (1, world, 1, 1)
        return cls(world_rank=_int(e, "RANK", 0), local_rank=_int(e, "LOCAL_RANK", 0),
                   world_size=world, local_world_size=_int(e, "LOCAL_WORLD_SIZE", world),
                   node_rank=_int(e, "GROUP_RANK", 0), mesh_names=names, mesh_shape=shape,
                   job_id=e.get(proto.JOB_ID), attempt=_int(e, proto.ATTEMPT, 1))

    # Ray Train's accessors -----------------------------------------------------------------
    def get_world_rank(self) -> int:
        return self.world_rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    # meshyard's additions ------------------------------------------------------------------
    def get_mesh_shape(self) -> dict[str, int]:
        """{"pp": 1, "dp_replicate": 2, "dp_shard": 2, "tp": 2}: the mesh the placement
        optimised for (TP inside an NVLink domain, DP across nodes in switch order)."""
        return dict(zip(self.mesh_names, self.mesh_shape, strict=True))

    def get_dp_rank(self) -> int:
        """This rank's data-parallel index (which data shard it reads; TP peers share it)."""
        m = self.get_mesh_shape()
        dp = m.get("dp_replicate", 1) * m.get("dp_shard", 1)
        return (self.world_rank // m.get("tp", 1)) % max(dp, 1)

    def get_dp_size(self) -> int:
        m = self.get_mesh_shape()
        return m.get("dp_replicate", 1) * m.get("dp_shard", 1)

    def get_device_mesh(self) -> Any:
        """torch's DeviceMesh over the job's dims (plus a flattened "dp"), built once; creates
        the default process group first when the code has not."""
        if "mesh" not in self._mesh:
            from meshyard.parallel import ensure_process_group, init_mesh

            device = ensure_process_group()
            self._mesh["mesh"] = init_mesh(device.type, self.mesh_shape, self.mesh_names)
        return self._mesh["mesh"]

    def get_job_id(self) -> str | None:
        return self.job_id

    def get_attempt(self) -> int:
        return self.attempt


_CONTEXT: list[TrainContext] = []


def get_context() -> TrainContext:
    if not _CONTEXT:
        _CONTEXT.append(TrainContext.from_environ())
    return _CONTEXT[0]
