"""Options shared by CLI commands, and turning flags into Settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.settings import Settings

DataDirOpt = Annotated[Path | None, typer.Option(
    "--data-dir", help="State directory [env MESHYARD_DATA_DIR; default ./.meshyard].")]
DatabaseUrlOpt = Annotated[str | None, typer.Option(
    "--database-url", help="SQLAlchemy URL [env MESHYARD_DATABASE_URL; default SQLite in the "
    "data dir].")]


def settings_from(**flags: Any) -> Settings:
    """Settings with the given flags on top of the environment (None means 'not given')."""
    return Settings(**{k: v for k, v in flags.items() if v is not None})
