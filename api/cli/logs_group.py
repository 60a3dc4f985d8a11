"""The `meshyard logs` group: `logs ID` (default: a job's log lines, api/cli/log_cmds.py) and
`logs parse FILE` (NCCL / PyTorch log events, api/cli/diag_cmds.py) side by side.

A first argument that is not a subcommand name (a job id, an option) runs the default `show`.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from api.cli.app import app

DEFAULT = "show"


class _DefaultGroup(TyperGroup):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # Before the group parses its own options: `logs --rank 1 ID` is `logs show ...`.
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [DEFAULT, *args]
        result: list[str] = super().parse_args(ctx, args)
        return result


logs_app = typer.Typer(cls=_DefaultGroup, no_args_is_help=True, add_completion=False,
                       help="A job's log lines (`logs ID`), or parse a log file "
                       "(`logs parse FILE --json`).")
app.add_typer(logs_app, name="logs")
