"""`meshyard place`: solve a placement for a declared cluster file and print it.

    meshyard place --cluster examples/clusters/dgx_h100_two_leaves.yaml --tp 8 \
        --dp-replicate 2 --json

prints {"ranks": [{"rank": 0, "node": ..., "gpu": ..., "coords": {...}}, ...], "estimate": {...}}
or exits 2 with {"error": {"reason": ..., "message": ...}}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.app import app
from orchestrator.mesh import MeshShape
from orchestrator.placement.solver import Constraints, Placement, solve
from orchestrator.spec import ConstraintMode, TopologyLevel


def _fail(reason: str, message: str, *, as_json: bool) -> typer.Exit:
    if as_json:
        typer.echo(json.dumps({"error": {"reason": reason, "message": message}}, indent=2))
    else:
        typer.echo(f"{reason}: {message}", err=True)
    return typer.Exit(2)


def _table(placement: Placement) -> str:
    lines = [f"{'rank':>5}  {'node':<20} {'gpu':>3}  pp dpr dps  ep  cp  tp"]
    for r in placement.ranks:
        c = r.coords
        lines.append(f"{r.rank:>5}  {r.node:<20} {r.gpu:>3}  {c['pp']:>2} {c['dp_replicate']:>3}"
                     f" {c['dp_shard']:>3} {c['ep']:>3} {c['cp']:>3} {c['tp']:>3}")
    est = placement.estimate
    lines.append(f"level: {placement.level} {'/'.join(placement.domain)}")
    for d in est.dimensions:
        lines.append(f"{d.dimension:<13} {d.seconds * 1e3:9.2f} ms/step  bottleneck {d.bottleneck}"
                     f" ({d.bottleneck_gbs:g} GB/s)")
    lines.append(f"total {est.total_s * 1e3:.2f} ms/step (exposed {est.exposed_s * 1e3:.2f} ms)")
    lines += [f"note: {n}" for n in placement.notes]
    return "\n".join(lines)


@app.command("place")
def place(
    cluster: Annotated[Path, typer.Option("--cluster", help="Declared cluster file (YAML).")],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, help="Pipeline-parallel degree.")] = 1,
    dp_shard: Annotated[int, typer.Option("--dp-shard", min=1, help="Sharded DP degree.")] = 1,
    dp_replicate: Annotated[int, typer.Option("--dp-replicate", min=1,
                                              help="Replicated DP degree.")] = 1,
    ep: Annotated[int, typer.Option("--ep", min=1, max=4096,
                                    help="Expert-parallel degree (MoE all-to-all group).")] = 1,
    cp: Annotated[int, typer.Option("--cp", min=1, max=4096,
                                    help="Context-parallel degree (ring of K/V exchanges).")] = 1,
    tp_within: Annotated[TopologyLevel, typer.Option("--tp-within",
                                                     help="Level each TP group stays inside.")]
    = TopologyLevel.NVLINK_DOMAIN,
    required: Annotated[bool, typer.Option("--required/--preferred",
                                           help="Wait rather than break tp_within, or relax "
                                           "it when it cannot hold.")] = True,
    avoid: Annotated[list[str] | None, typer.Option("--avoid",
                                                    help="Node name or id to avoid (repeat).")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Place a job's ranks on a declared cluster (topology-aware BestFit)."""
    from orchestrator.topology.declared import load_cluster_file

    try:
        topo = load_cluster_file(cluster)
    except (OSError, ValueError) as exc:
        raise _fail("INVALID_CLUSTER", f"{cluster}: {exc}", as_json=as_json) from None
    mode = ConstraintMode.REQUIRED if required else ConstraintMode.PREFERRED
    constraints = Constraints(tp_within=tp_within, mode=mode, avoid_nodes=tuple(avoid or ()))
    mesh = MeshShape(pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, ep=ep, cp=cp, tp=tp)
    result = solve(topo, mesh, constraints=constraints)
    if not isinstance(result, Placement):
        raise _fail(result.reason.value, result.message, as_json=as_json)
    out: dict[str, Any] = result.as_dict()
    typer.echo(json.dumps(out, indent=2) if as_json else _table(result))
