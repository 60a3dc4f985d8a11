"""`meshyard serve` and `meshyard db upgrade` (server-side commands)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from api.cli.app import app
from api.cli.common import DatabaseUrlOpt, DataDirOpt, settings_from

db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")


@app.command("serve")
def serve_cmd(
    host: Annotated[str | None, typer.Option(help="Bind address [default 127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(help="Port (0 picks a free one) [default 8470].")]
    = None,
    data_dir: DataDirOpt = None,
    database_url: DatabaseUrlOpt = None,
    ray_address: Annotated[str | None, typer.Option(help="Existing Ray cluster.")] = None,
    cluster_file: Annotated[Path | None, typer.Option(help="Declared topology YAML.")] = None,
    checkpoint_storage: Annotated[Path | None, typer.Option(
        help="A directory every host mounts at this path (NFS, a parallel filesystem), where "
        "jobs keep their checkpoints [env MESHYARD_CHECKPOINT_STORAGE; default: each job's run "
        "dir, on the host a rank runs on].")] = None,
    checkpoint_uri: Annotated[str | None, typer.Option(
        help="Object storage for checkpoints, s3://BUCKET[/PREFIX], reached at --s3-endpoint "
        "with MESHYARD_S3_ACCESS_KEY / MESHYARD_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID / "
        "AWS_SECRET_ACCESS_KEY) [env MESHYARD_CHECKPOINT_URI].")] = None,
    s3_endpoint: Annotated[str | None, typer.Option(
        help="The checkpoint store's http(s)://HOST[:PORT] [env MESHYARD_S3_ENDPOINT; default: "
        "AWS].")] = None,
    allow_fault_injection: Annotated[bool | None, typer.Option(
        "--allow-fault-injection", help="Accept inject_fault blocks (tests, demos).")] = None,
    no_scheduler: Annotated[bool, typer.Option(
        "--no-scheduler", help="API only: do not start the scheduler (jobs stay QUEUED).")]
    = False,
    demo: Annotated[bool, typer.Option(help="Submit examples/quickstart.yaml once up.")] = False,
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = True,
) -> None:
    """Run the control plane: apply migrations, ensure an admin, serve the API."""
    from api.server import serve  # uvicorn and the store load only for this command

    settings = settings_from(host=host, port=port, data_dir=data_dir, database_url=database_url,
                             ray_address=ray_address, cluster_file=cluster_file,
                             checkpoint_storage=checkpoint_storage,
                             checkpoint_uri=checkpoint_uri, s3_endpoint=s3_endpoint,
                             allow_fault_injection=allow_fault_injection,
                             scheduler_enabled=False if no_scheduler else None)
    serve(settings, demo=demo, access_log=access_log)


@db_app.command("upgrade")
def db_upgrade(data_dir: DataDirOpt = None, database_url: DatabaseUrlOpt = None) -> None:
    """Apply every pending migration (alembic upgrade head)."""
    from orchestrator.store.db import upgrade_database

    settings = settings_from(data_dir=data_dir, database_url=database_url)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.resolved_database_url)
    typer.echo("database at head")
