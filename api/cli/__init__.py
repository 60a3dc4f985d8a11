"""`meshyard` console script. Each module below registers its commands on the root app."""

from api.cli import (  # noqa: F401  (each import registers its commands)
    access_cmds,
    diag_cmds,
    job_cmds,
    log_cmds,
    node_cmds,
    place_cmds,
    plan_cmds,
    server_cmds,
    spec_cmds,
    token_cmds,
    topo_cmds,
    watch_cmds,
)
from api.cli.app import app


def main() -> None:
    app()
