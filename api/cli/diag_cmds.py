"""Hang diagnosis commands:

* `meshyard logs parse FILE [--json]`: NCCL_DEBUG / PyTorch / gloo log events of one file;
* `meshyard diagnose --fr DIR [--logs DIR] [--json]`: offline diagnosis of any PyTorch job
  from its Flight Recorder dumps and logs (no server needed);
* `meshyard diagnosis ID [--json] [--all]`: a job's newest stored report as Markdown; the
  first line is the sentence to act on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from api.cli.app import app
from api.cli.common import DataDirOpt
from api.cli.logs_group import logs_app
from api.client import resolve_connection
from orchestrator.watchdog.report import DiagnosisReport

UrlOpt = Annotated[str | None, typer.Option("--url", help="Server URL [env MESHYARD_URL].")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="API token [env MESHYARD_TOKEN].")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@logs_app.command("parse")
def logs_parse(path: Annotated[str, typer.Argument(help="Log file ('-' reads stdin).")],
               as_json: JsonOpt = False) -> None:
    """Parse NCCL_DEBUG, PyTorch watchdog / desync, gloo and monitored-barrier lines."""
    from orchestrator.watchdog.logs import parse_text

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(errors="replace")
    except OSError as exc:
        typer.echo(f"cannot read {path}: {exc}", err=True)
        raise typer.Exit(2) from None
    events = parse_text(text)
    if as_json:
        typer.echo(json.dumps([e.to_dict() for e in events], indent=1, default=str))
        return
    for e in events:
        typer.echo(f"{e.kind:28} {e.describe()}")
    typer.echo(f"{len(events)} event(s)", err=True)


@app.command("diagnose")
def diagnose(fr: Annotated[Path | None, typer.Option(
                 "--fr", help="Directory of Flight Recorder dumps (one file per rank).")] = None,
             logs: Annotated[Path | None, typer.Option(
                 "--logs", help="Directory of log files (NCCL_DEBUG, stderr of the ranks).")]
             = None,
             world_size: Annotated[int | None, typer.Option(
                 "--world-size", min=1, help="Ranks in the job, when the inputs miss some.")]
             = None,
             as_json: JsonOpt = False) -> None:
    """Diagnose a hung PyTorch job offline (any launcher, not only meshyard)."""
    from orchestrator.watchdog.offline import diagnose_offline

    if fr is None and logs is None:
        typer.echo("give --fr DIR and/or --logs DIR", err=True)
        raise typer.Exit(2)
    for label, d in (("--fr", fr), ("--logs", logs)):
        if d is not None and not d.exists():
            typer.echo(f"{label} {d} does not exist", err=True)
            raise typer.Exit(2)
    report = diagnose_offline(fr_dir=fr, logs_dir=logs, world_size=world_size)
    typer.echo(report.to_json() if as_json else report.to_markdown().rstrip())


def _fetch(url: str, token: str | None, job_id: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = httpx.get(f"{url}/v1/jobs/{job_id}/diagnoses", headers=headers, timeout=30.0)
    if resp.status_code >= 400:
        typer.echo(f"{resp.status_code}: {resp.text[:500]}", err=True)
        raise typer.Exit(1)
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


@app.command("diagnosis")
def diagnosis(job_id: Annotated[str, typer.Argument(help="Job id.")],
              every: Annotated[bool, typer.Option("--all", help="Every report, newest first.")]
              = False,
              as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None,
              data_dir: DataDirOpt = None) -> None:
    """Print a job's newest hang diagnosis as Markdown (first line: what to do)."""
    conn = resolve_connection(url=url, token=token, data_dir=data_dir)
    try:
        items = _fetch(conn.url, conn.token, job_id)
    except httpx.TransportError as exc:
        typer.echo(f"cannot reach the server at {conn.url}: {exc}", err=True)
        raise typer.Exit(2) from None
    if not items:
        typer.echo(f"no diagnosis for {job_id}: the watchdog found no hang", err=True)
        raise typer.Exit(1)
    chosen = items if every else items[:1]  # the API lists newest first
    if as_json:
        typer.echo(json.dumps(chosen if every else chosen[0], indent=1, default=str))
        return
    out = []
    for item in chosen:
        text = DiagnosisReport.from_dict(item["report"]).to_markdown().rstrip()
        out.append(text + f"\n\n_attempt {item['attempt']} · diagnosis {item['id']} · "
                   f"{item['created_at']}_")
    typer.echo("\n\n---\n\n".join(out))
