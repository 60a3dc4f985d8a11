"""Options shared by CLI commands, turning flags into Settings, and running client calls."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from pydantic import BaseModel

from api.client import MeshyardAPIError, MeshyardClient
from orchestrator.settings import Settings

DataDirOpt = Annotated[Path | None, typer.Option(
    "--data-dir", help="State directory [env MESHYARD_DATA_DIR; default ./.meshyard].")]
DatabaseUrlOpt = Annotated[str | None, typer.Option(
    "--database-url", help="SQLAlchemy URL [env MESHYARD_DATABASE_URL; default SQLite in the "
    "data dir].")]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Server URL [env MESHYARD_URL].")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="API token [env MESHYARD_TOKEN].")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def settings_from(**flags: Any) -> Settings:
    """Settings with the given flags on top of the environment (None means 'not given')."""
    return Settings(**{k: v for k, v in flags.items() if v is not None})


def run_client(url: str | None, token: str | None, data_dir: Path | None,
               action: Callable[[MeshyardClient], Any]) -> Any:
    """Runs one client call; API errors and unreachable servers become a message + exit code."""
    with MeshyardClient.connect(url=url, token=token, data_dir=data_dir) as client:
        try:
            return action(client)
        except MeshyardAPIError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(1) from None
        except httpx.TransportError as exc:
            typer.echo(f"cannot reach the server at {client.base_url}: {exc}", err=True)
            raise typer.Exit(2) from None


def print_json(model: BaseModel | list[Any]) -> None:
    if isinstance(model, list):
        typer.echo(json.dumps([m.model_dump(mode="json") for m in model], indent=2))
    else:
        typer.echo(model.model_dump_json(indent=2))
