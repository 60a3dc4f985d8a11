"""The root typer app; command modules register on it (see api/cli/__init__.py)."""

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="meshyard: topology-aware distributed training on Ray.")
