"""`meshyard node list|cordon|uncordon`: the node health ledger over the API.

    meshyard node list                                  # state, since / until, why
    meshyard node cordon gpu-node-7 --reason "ECC errors" --permanent   # admins
    meshyard node uncordon gpu-node-7 --reason "GPU replaced"
"""

from __future__ import annotations

from typing import Annotated

import typer

from api.cli.app import app
from api.cli.common import DataDirOpt, JsonOpt, TokenOpt, UrlOpt, print_json, run_client
from api.schemas import NodeHealthOut

node_app = typer.Typer(no_args_is_help=True, help="Node health: list, cordon, uncordon.")
app.add_typer(node_app, name="node")
NodeArg = Annotated[str, typer.Argument(help="Node name (meshyard node list).")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why; kept with the evidence.")]


def _line(n: NodeHealthOut) -> str:
    when = ""
    if n.state == "cordoned":
        when = "permanent" if n.permanent else \
            f"until {n.until:%Y-%m-%d %H:%M:%S}" if n.until else ""
    elif n.since is not None:
        when = f"since {n.since:%Y-%m-%d %H:%M:%S}"
    gpus = f" GPUs {','.join(map(str, n.cordoned_gpus))} cordoned" if n.cordoned_gpus else ""
    diags = f" diagnoses {','.join(map(str, n.diagnosis_ids))}" if n.diagnosis_ids else ""
    alive = "" if n.alive else " (not alive)"
    return f"{n.name:<24} {n.state:<9} {when:<25} {n.reason[:80]}{gpus}{diags}{alive}".rstrip()


@node_app.command("list")
def node_list(url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
              as_json: JsonOpt = False) -> None:
    """Every node with its health state and the evidence behind it."""
    nodes = run_client(url, token, data_dir, lambda c: c.list_nodes())
    if as_json:
        print_json(nodes)
        return
    for n in nodes.items:
        typer.echo(_line(n))


@node_app.command("cordon")
def node_cordon(name: NodeArg, reason: ReasonOpt = "",
                permanent: Annotated[bool, typer.Option(
                    "--permanent", help="Until uncordoned (else MESHYARD_NODE_CORDON_S).")]
                = False,
                url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None) -> None:
    """Take a node out of scheduling (admins). Running jobs keep running."""
    n = run_client(url, token, data_dir,
                   lambda c: c.cordon(name, reason=reason, permanent=permanent))
    typer.echo(_line(n))


@node_app.command("uncordon")
def node_uncordon(name: NodeArg, reason: ReasonOpt = "", url: UrlOpt = None,
                  token: TokenOpt = None, data_dir: DataDirOpt = None) -> None:
    """Make a node healthy again (admins); its past evidence stops counting."""
    n = run_client(url, token, data_dir, lambda c: c.uncordon(name, reason=reason))
    typer.echo(_line(n))
