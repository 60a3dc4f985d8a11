"""`meshyard spec schema` and `meshyard version`."""

import json
from importlib.metadata import version as dist_version

import typer

from api.cli.app import app
from orchestrator.spec import json_schema

spec_app = typer.Typer(no_args_is_help=True, help="JobSpec tools.")
app.add_typer(spec_app, name="spec")


@spec_app.command("schema")
def schema() -> None:
    """Print the JobSpec JSON Schema."""
    typer.echo(json.dumps(json_schema(), indent=2))


@app.command("version")
def version() -> None:
    """Print the meshyard version."""
    typer.echo(dist_version("meshyard"))
