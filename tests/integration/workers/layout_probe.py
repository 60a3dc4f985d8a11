"""What each rank of a layout holds once the built-in loop has parallelized its model: for
every parameter, its name in the unsplit model, and for a DTensor its placements, the global
ranks along each of its mesh dims through this rank ('S<dim>' for a shard, 'R' for a
replica), its local and global shape.

    python -m tests.integration.workers.layout_probe --nproc N --out DIR --spec A.json ...

The ranks are forked from one process that imported torch once (forkrun.py) and share one
process group; each spec writes ``DIR/<spec stem>/rank_<r>.json`` (``{"error": ...}`` when
the loop refused the layout). Nothing trains: the model is built and parallelized by
`workers.loop.train.build_step_runner`, as the loop does before its first step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement, Shard, _StridedShard
from torch.nn.parallel import DistributedDataParallel

from orchestrator.mesh import MeshShape
from orchestrator.spec import JobSpec
from tests.integration.workers import forkrun
from workers.host.env import DistEnv, init_distributed
from workers.host.faults import FaultInjector
from workers.loop.launch import load_spec
from workers.loop.mesh import build_mesh
from workers.loop.model import build_model
from workers.loop.train import build_step_runner

# Wrapper names torch inserts into parameter names (activation checkpointing, DDP).
_WRAPPERS = ("_checkpoint_wrapped_module.", "module.")


def _fqn(name: str) -> str:
    for w in _WRAPPERS:
        name = name.replace(w, "")
    return name


def _mesh_groups(t: DTensor) -> dict[str, list[int]]:
    """Mesh dim name -> the global ranks along that dim through this rank."""
    mesh = t.device_mesh
    coord = mesh.get_coordinate()
    assert coord is not None
    ranks = mesh.mesh
    out = {}
    for i, name in enumerate(mesh.mesh_dim_names or ()):
        index: list[Any] = list(coord)
        index[i] = slice(None)
        out[name] = [int(r) for r in ranks[tuple(index)].flatten()]
    return out


def _placement(p: Placement) -> str:
    """'S<dim>' for a shard (strided ones too), 'R' for a replica, else torch's own name."""
    if isinstance(p, Shard | _StridedShard):
        return f"S{p.dim}"
    return "R" if p.is_replicate() else str(p)


def _param(p: nn.Parameter) -> dict[str, Any]:
    if not isinstance(p, DTensor):
        return {"dtensor": False, "local_shape": list(p.shape), "global_shape": list(p.shape)}
    return {"dtensor": True, "groups": _mesh_groups(p),
            "placements": [_placement(x) for x in p.placements],
            "local_shape": list(p.to_local().shape), "global_shape": list(p.shape)}


def describe(spec: JobSpec, *, rank: int) -> dict[str, Any]:
    dims = MeshShape.from_parallelism(spec.parallelism)
    device = torch.device("cpu")
    built = build_model(spec, seed=spec.training.seed)
    runner = build_step_runner(spec, built=built, dims=dims,
                               mesh=build_mesh(dims, device_type=device.type), device=device,
                               rank=rank, faults=FaultInjector(None, rank=rank))
    out: dict[str, Any] = {"params": {}, "ddp_groups": []}
    for part in runner.model_parts:
        if isinstance(part, DistributedDataParallel):
            out["ddp_groups"].append(dist.get_process_group_ranks(part.process_group))
        for name, p in part.named_parameters():
            out["params"][_fqn(name)] = _param(p)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="layout_probe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", action="append", required=True)
    args = ap.parse_args(argv)
    env = DistEnv.from_environ()
    specs = [(Path(s), load_spec(s)) for s in args.spec]
    init_distributed(specs[0][1], dist_env=env, device=torch.device("cpu"))
    try:
        for path, spec in specs:
            try:
                record = describe(spec, rank=env.rank)
            except ValueError as exc:  # a layout the loop refuses, on every rank alike
                record = {"error": f"{type(exc).__name__}: {exc}"}
            out = Path(args.out) / path.stem
            out.mkdir(parents=True, exist_ok=True)
            (out / f"rank_{env.rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(forkrun.main(sys.argv[1:], entry=main))
