"""`meshyard` console script. Each module below registers its commands on the root app."""

from api.cli import spec_cmds  # noqa: F401  (registers commands)
from api.cli.app import app

for _name in ("server_cmds", "token_cmds", "access_cmds", "job_cmds", "topo_cmds",
              "place_cmds", "log_cmds", "diag_cmds", "plan_cmds"):
    try:
        __import__(f"api.cli.{_name}")
    except ModuleNotFoundError as exc:  # a command module not written yet
        if exc.name != f"api.cli.{_name}":
            raise


def main() -> None:
    app()
