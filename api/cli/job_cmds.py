"""`meshyard submit/list/status/events/cancel`: client commands over the REST API.

Server and token: --url/--token, else MESHYARD_URL/MESHYARD_TOKEN, else the data dir
(server.json written by `serve`, and admin.token).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from api.cli.app import app
from api.cli.common import DataDirOpt, JsonOpt, TokenOpt, UrlOpt
from api.cli.common import print_json as _print_json
from api.cli.common import run_client as _run
from api.schemas import Event, JobSummary


def _job_line(job: JobSummary) -> str:
    step = "-" if job.last_step is None else \
        f"{job.last_step}/{job.total_steps}" if job.total_steps else str(job.last_step)
    line = f"{job.id:<22} {job.state.value:<11} {step:>11}  {job.owner:<12} {job.name}"
    return line + (f"  [{job.condition.text}]" if job.condition is not None else "")


@app.command("submit")
def submit(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                                help="Job spec (.yaml, .yml or .json).")],
           submission_id: Annotated[str | None, typer.Option(
               help="Idempotency key: resubmitting with it returns the same job.")] = None,
           working_dir: Annotated[Path | None, typer.Option(
               "--working-dir", file_okay=False,
               help="Ship this directory as the entrypoint's code (zipped with .gitignore / "
               ".meshyardignore excludes, uploaded, recorded in the spec).")] = None,
           url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
           as_json: JsonOpt = False) -> None:
    """Submit a job spec; prints the job id."""
    if working_dir is not None:
        try:
            job = _run(url, token, data_dir, lambda c: c.submit_with_code(
                file, working_dir=working_dir, submission_id=submission_id))
        except (ValueError, FileNotFoundError) as exc:
            typer.echo(f"cannot ship {working_dir}: {exc}", err=True)
            raise typer.Exit(1) from None
    else:
        job = _run(url, token, data_dir, lambda c: c.submit(file, submission_id=submission_id))
    if as_json:
        _print_json(job)
    else:
        verb = "submitted" if job.created else "already submitted"
        typer.echo(f"{job.id} {verb} ({job.name}, {job.world_size} ranks, {job.state.value})")
    for w in job.warnings:
        typer.echo(f"warning: {w.loc}: {w.msg}", err=True)


@app.command("list")
def list_jobs(state: Annotated[list[str] | None, typer.Option(help="Filter; repeatable.")]
              = None,
              owner: Annotated[str | None, typer.Option()] = None,
              name: Annotated[str | None, typer.Option()] = None,
              limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
              url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
              as_json: JsonOpt = False) -> None:
    """List jobs, newest first."""
    states = [s.upper() for s in state] if state else None
    page = _run(url, token, data_dir, lambda c: c.list_jobs(state=states, owner=owner,
                                                            name=name, limit=limit))
    if as_json:
        _print_json(page)
        return
    typer.echo(f"{'ID':<22} {'STATE':<11} {'STEP':>11}  {'OWNER':<12} NAME")
    for job in page.items:
        typer.echo(_job_line(job))
    if page.next_cursor:
        typer.echo(f"(more: raise --limit; next cursor {page.next_cursor})")


@app.command("status")
def status(job_id: str, url: UrlOpt = None, token: TokenOpt = None,
           data_dir: DataDirOpt = None, as_json: JsonOpt = False) -> None:
    """Show one job."""
    job = _run(url, token, data_dir, lambda c: c.get_job(job_id))
    if as_json:
        _print_json(job)
        return
    lines = [f"{job.id}  {job.name}", f"  state:    {job.state.value}",
             f"  status:   {job.status}",
             f"  owner:    {job.owner}", f"  ranks:    {job.world_size}",
             f"  attempt:  {job.current_attempt}",
             f"  step:     {job.last_step if job.last_step is not None else '-'}"
             + (f"/{job.total_steps}" if job.total_steps else "")]
    if job.last_loss is not None:
        lines.append(f"  loss:     {job.last_loss:.4f}")
    if job.failure_reason:
        lines.append(f"  failure:  {job.failure_reason}")
    if job.condition is not None:
        c = job.condition
        lines.append(f"  culprit:  {', '.join(map(str, c.culprit_ranks)) or '-'} "
                     f"({c.verdict}; `meshyard diagnosis {job.id}`)")
    if job.pending_reason:
        lines.append(f"  waiting:  {json.dumps(job.pending_reason)}")
    if job.message and job.message != job.status:
        lines.append(f"  message:  {job.message}")
    typer.echo("\n".join(lines))


def _event_line(event: Event) -> str:
    change = f"{event.src or ''} -> {event.dst}".lstrip() if event.dst else event.kind
    reason = f" [{event.reason}]" if event.reason else ""
    return f"{event.at.isoformat(timespec='seconds')}  {change}{reason}  {event.message}"


@app.command("events")
def events(job_id: str, after: Annotated[int, typer.Option(min=0)] = 0,
           url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
           as_json: JsonOpt = False) -> None:
    """Show a job's events (state changes and notes)."""
    found = _run(url, token, data_dir, lambda c: c.events(job_id, after=after))
    if as_json:
        _print_json(found)
        return
    for event in found:
        typer.echo(_event_line(event))


@app.command("cancel")
def cancel(job_id: str, url: UrlOpt = None, token: TokenOpt = None,
           data_dir: DataDirOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a job (queued: at once; running: stops its workers)."""
    job = _run(url, token, data_dir, lambda c: c.cancel(job_id))
    if as_json:
        _print_json(job)
    else:
        typer.echo(f"{job.id} {job.state.value}")
