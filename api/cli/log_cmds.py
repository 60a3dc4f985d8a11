"""`meshyard logs ID [--rank N] [--tail K] [-f] [--raw]`: a job's per-rank log lines.

A rank's output is the job's code talking to the user's terminal: escape sequences in it
could write the clipboard (OSC 52), set the window title, move the cursor or overwrite lines
that came before. Lines are printed without control sequences (orchestrator/text/ansi.py
`strip_controls`) unless `--raw` asks for the bytes as the rank wrote them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import typer

from api.cli.common import DataDirOpt
from api.cli.logs_group import DEFAULT, logs_app
from api.client import resolve_connection
from orchestrator.text.ansi import strip_controls

UrlOpt = Annotated[str | None, typer.Option("--url", help="Server URL [env MESHYARD_URL].")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="API token [env MESHYARD_TOKEN].")]


def _format(line: dict[str, Any], *, prefix: bool, raw: bool = False) -> str:
    text = str(line["line"])
    if prefix:
        who = "-" if line.get("rank") is None else line["rank"]
        text = f"[rank {who} {line['stream']}] {text}"
    return text if raw else strip_controls(text)


def _follow(url: str, token: str | None, job_id: str, *, rank: int | None, tail: int,
            prefix: bool, raw: bool) -> None:
    params: dict[str, Any] = {"tail": tail}
    if rank is not None:
        params["rank"] = rank
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(30.0, read=None)  # a quiet job may print nothing for a while
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as http, \
            http.stream("GET", f"/v1/jobs/{job_id}/logs/follow", params=params) as resp:
        if resp.status_code >= 400:
            resp.read()
            typer.echo(f"{resp.status_code}: {resp.text[:500]}", err=True)
            raise typer.Exit(1)
        for item in resp.iter_lines():
            if item.strip():
                typer.echo(_format(json.loads(item), prefix=prefix, raw=raw))


@logs_app.command(DEFAULT)
def logs(job_id: Annotated[str, typer.Argument(help="Job id.")],
         rank: Annotated[int | None, typer.Option("--rank", "-r", help="Only this rank.")]
         = None,
         tail: Annotated[int, typer.Option("--tail", "-n", min=1, max=10_000,
                                           help="Last N lines.")] = 100,
         follow: Annotated[bool, typer.Option("--follow", "-f",
                                              help="Keep printing until the job ends.")]
         = False,
         raw: Annotated[bool, typer.Option("--raw", help="Print the lines as the ranks wrote "
                                           "them, terminal escape sequences included.")]
         = False,
         url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None) -> None:
    """Print a job's log lines (stdout, stderr and loop messages of every rank, or one),
    without terminal control sequences unless --raw."""
    conn = resolve_connection(url=url, token=token, data_dir=data_dir)
    prefix = rank is None
    try:
        if follow:
            _follow(conn.url, conn.token, job_id, rank=rank, tail=tail, prefix=prefix, raw=raw)
            return
        params: dict[str, Any] = {"tail": tail}
        if rank is not None:
            params["rank"] = rank
        headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}
        resp = httpx.get(f"{conn.url}/v1/jobs/{job_id}/logs", params=params, headers=headers,
                         timeout=30.0)
        if resp.status_code >= 400:
            typer.echo(f"{resp.status_code}: {resp.text[:500]}", err=True)
            raise typer.Exit(1)
        for item in resp.json()["items"]:
            typer.echo(_format(item, prefix=prefix, raw=raw))
    except httpx.TransportError as exc:
        typer.echo(f"cannot reach the server at {conn.url}: {exc}", err=True)
        raise typer.Exit(2) from None
