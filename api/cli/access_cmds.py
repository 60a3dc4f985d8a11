"""`meshyard user list|role` and `meshyard quota show|set`: roles and quotas over the API.

    meshyard user role alice viewer          # admin, user or viewer
    meshyard quota set --user alice --max-queued-jobs 20 --max-running-gpus 16
    meshyard quota show --user alice         # effective limits, and which were set for alice
"""

from __future__ import annotations

from typing import Annotated

import typer

from api.cli.app import app
from api.cli.common import DataDirOpt, JsonOpt, TokenOpt, UrlOpt, print_json, run_client
from api.schemas import QuotaInfo

user_app = typer.Typer(no_args_is_help=True, help="Users and their roles (admins).")
quota_app = typer.Typer(no_args_is_help=True, help="Per-user quotas.")
app.add_typer(user_app, name="user")
app.add_typer(quota_app, name="quota")


@user_app.command("list")
def user_list(url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
              as_json: JsonOpt = False) -> None:
    """Every user and their role."""
    users = run_client(url, token, data_dir, lambda c: c.list_users())
    if as_json:
        print_json(users)
        return
    for u in users.items:
        typer.echo(f"{u.name:<24} {u.role}")


@user_app.command("role")
def user_role(name: Annotated[str, typer.Argument(help="User name.")],
              role: Annotated[str, typer.Argument(help="admin, user or viewer.")],
              url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None) -> None:
    """Give a user a role."""
    user = run_client(url, token, data_dir, lambda c: c.set_role(name, role))
    typer.echo(f"{user.name} is now {user.role}")


def _show(q: QuotaInfo) -> None:
    for name in ("max_queued_jobs", "max_running_gpus", "max_running_cpus", "max_priority"):
        value = getattr(q, name)
        source = "set" if name in q.explicit else "default"
        typer.echo(f"{name:<18} {'unlimited' if value is None else f'{value:g}':<10} ({source})")


@quota_app.command("show")
def quota_show(user: Annotated[str, typer.Option("--user", help="Whose quota.")],
               url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
               as_json: JsonOpt = False) -> None:
    """A user's effective limits."""
    q = run_client(url, token, data_dir, lambda c: c.get_quota(user))
    print_json(q) if as_json else _show(q)


@quota_app.command("set")
def quota_set(
    user: Annotated[str, typer.Option("--user", help="Whose quota.")],
    max_queued_jobs: Annotated[int | None, typer.Option(min=0)] = None,
    max_running_gpus: Annotated[int | None, typer.Option(min=0)] = None,
    max_running_cpus: Annotated[float | None, typer.Option(min=0)] = None,
    max_priority: Annotated[int | None, typer.Option(min=-1000, max=1000)] = None,
    url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a user's limits (admins). Limits not given go back to the server's defaults."""
    limits = {"max_queued_jobs": max_queued_jobs, "max_running_gpus": max_running_gpus,
              "max_running_cpus": max_running_cpus, "max_priority": max_priority}
    q = run_client(url, token, data_dir, lambda c: c.set_quota(user, limits))
    print_json(q) if as_json else _show(q)
