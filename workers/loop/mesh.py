"""The DeviceMesh of a job: dims (pp, dp_replicate, dp_shard, ep, cp, tp) plus a flattened "dp".

The rank <-> coordinates arithmetic is `meshyard.mesh.MeshShape` (the one contract the
solver, runtime, watchdog and user code share); this module only builds torch's mesh from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.mesh import DIMS, MeshShape

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def build_mesh(dims: MeshShape, *, device_type: str) -> DeviceMesh:
    """DeviceMesh with dims (pp, dp_replicate, dp_shard, ep, cp, tp) plus a flattened "dp".

    Needs the default process group (or world size 1). All six names always exist, so
    callers slice ``mesh["tp"]`` without checking which degrees are > 1.
    """
    import torch.distributed as dist

    from meshyard.parallel import init_mesh

    world = dist.get_world_size() if dist.is_initialized() else 1
    dims.validate_world(world)
    return init_mesh(device_type, dims.sizes, DIMS)
