"""`meshyard watch [OPTIONS] -- COMMAND...`: run a launcher (torchrun, or any command whose
Python workers get RANK) on this machine under meshyard's hang watchdog, with the probe in
every rank and no change to the code; on a hang print the report and keep the evidence
directory `meshyard diagnose` reads (api/cli/local_watch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from api.cli.app import app


@app.command("watch", context_settings={"allow_interspersed_args": False})
def watch(command: Annotated[list[str], typer.Argument(
              help="The launcher and its arguments, after `--`: "
                   "torchrun --nproc_per_node=N train.py ARGS.")],
          out: Annotated[Path, typer.Option(
              "--out", help="Evidence directory (reports, Flight Recorder dumps, logs).")]
          = Path("meshyard-watch"),
          stall_timeout_s: Annotated[float | None, typer.Option(
              "--stall-timeout", help="Seconds without a collective before a hang is "
              "diagnosed; default: adaptive (max(12 s, 5 x p95 of the gaps)).")] = None,
          first_timeout_s: Annotated[float | None, typer.Option(
              "--first-timeout", help="Seconds allowed before the first collective "
              "(imports, model download, compile); default 300.")] = None,
          observe: Annotated[bool, typer.Option(
              "--observe", help="Report a hang but leave the job running.")] = False) -> None:
    """Watch a torchrun job for hangs: which rank, where in your code, and why.

    Exit status: the launcher's own (0 when training finished); 3 when a hang was diagnosed
    and the job ended by it (not with --observe); 2 for a bad option; 127 when the launcher
    cannot be run.
    """
    from api.cli.local_watch import LocalWatch
    from orchestrator.spec import Watchdog

    try:
        policy = Watchdog(stall_timeout_s=stall_timeout_s, first_step_timeout_s=first_timeout_s)
    except ValidationError as exc:
        typer.echo(f"invalid timeout: {exc.errors()[0]['loc'][-1]}: {exc.errors()[0]['msg']}",
                   err=True)
        raise typer.Exit(2) from None
    try:
        runner = LocalWatch(command, out=out.resolve(), policy=policy, observe=observe)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    try:
        code = runner.run()
    except FileNotFoundError as exc:
        typer.echo(f"cannot run {command[0]!r}: {exc.strerror}", err=True)
        raise typer.Exit(127) from None
    raise typer.Exit(code)
