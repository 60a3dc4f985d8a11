"""The rank's context: torchrun's variables plus the job's mesh (MESHYARD_MESH_*)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshyard import _protocol as proto
from meshyard.mesh import DIMS, MeshShape


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
        names = tuple(n for n in e.get(proto.MESH_DIM_NAMES, "").split(",") if n) or DIMS
        try:
            shape = tuple(int(x) for x in e.get(proto.MESH_SHAPE, "").split(",") if x)
        except ValueError:
            shape = ()
        if len(shape) != len(names):  # not under meshyard: all ranks data-parallel
            names, shape = DIMS, MeshShape(dp_replicate=max(world, 1)).sizes
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
        """{"pp": 1, "dp_replicate": 2, "dp_shard": 2, "ep": 1, "cp": 1, "tp": 2}: the mesh
        the placement optimised for (TP inside an NVLink domain, DP across nodes in switch
        order)."""
        return dict(zip(self.mesh_names, self.mesh_shape, strict=True))

    def get_mesh_dims(self) -> MeshShape:
        """The job's degrees as the rank <-> coordinates contract (`meshyard.mesh`)."""
        return MeshShape.from_degrees(self.get_mesh_shape())

    def get_dp_rank(self) -> int:
        """Which data shard this rank reads (`MeshShape.dp_index`): TP, CP and pipeline peers
        share it; expert-parallel ranks read their own."""
        return self.get_mesh_dims().dp_index(self.world_rank)

    def get_dp_size(self) -> int:
        """How many distinct data shards the job reads (`MeshShape.data_shards`)."""
        return self.get_mesh_dims().data_shards

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

    def should_stop(self) -> bool:
        """True once meshyard asked this rank to stop: a higher-priority job preempts the job
        (or it was cancelled). Save a checkpoint (`meshyard.train.report(..., checkpoint=)`)
        and return; the job resumes from it when it fits again. The worker sends SIGTERM
        with the request and SIGKILL after the job's `preemption.grace_s`. The first call,
        from the main thread, makes SIGTERM set this flag instead of ending the process, so
        a loop that asks every step gets the whole grace period to save."""
        _watch_sigterm()
        return _SIGTERM.received or _stop_file_exists()


_CONTEXT: list[TrainContext] = []


class _SigtermFlag:
    """Set by the SIGTERM handler. A plain attribute, no lock: a handler that took a lock
    (`threading.Event.set`) deadlocks when a second SIGTERM interrupts it while it holds
    the lock, and the worker signals a rank's process group and its process tree both."""

    received = False


_SIGTERM = _SigtermFlag()
_WATCHING: list[bool] = []


def _watch_sigterm() -> None:
    if _WATCHING or threading.current_thread() is not threading.main_thread():
        return
    _WATCHING.append(True)
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: object) -> None:
    _SIGTERM.received = True


def _stop_file_exists() -> bool:
    path = os.environ.get(proto.STOP_FILE)
    return path is not None and path != "" and os.path.exists(path)


def get_context() -> TrainContext:
    if not _CONTEXT:
        _CONTEXT.append(TrainContext.from_environ())
    return _CONTEXT[0]
