"""`meshyard token create|list|revoke`: over the API, or offline with --database-url.

Over the API (the default; server and token as for every client command: --url/--token, else
MESHYARD_URL/MESHYARD_TOKEN, else the data dir): admins manage any user's tokens, others
their own. `--database-url` is the offline bootstrap (a first admin token before any server
exists) and is refused while a server runs on that database (api/cli/offline.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from api.cli.app import app
from api.cli.common import DataDirOpt, JsonOpt, TokenOpt, UrlOpt, print_json, run_client
from api.cli.offline import ServerRunning, offline_store
from api.client import MeshyardClient
from api.schemas import TokenInfo, TokenList

token_app = typer.Typer(no_args_is_help=True, help="API tokens.")
app.add_typer(token_app, name="token")

OfflineOpt = Annotated[str | None, typer.Option(
    "--database-url", help="Offline bootstrap: work on this database directly (refused while "
    "a server runs on it). Without it the command goes over the API.")]
RoleOpt = Annotated[str | None, typer.Option(
    "--role", help="admin, user or viewer (admins only; a new user defaults to user).")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _role(admin: bool, role: str | None) -> str | None:
    if admin and role not in (None, "admin"):
        raise _fail("--admin and --role disagree; give one")
    return "admin" if admin else role


@token_app.command("create")
def token_create(
    user: Annotated[str | None, typer.Option("--user", help="User name (default: you; "
                                             "admins: created if missing).")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Same as --role admin.")] = False,
    role: RoleOpt = None,
    label: Annotated[str, typer.Option(help="Note stored with the token.")] = "",
    url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
    database_url: OfflineOpt = None,
) -> None:
    """Create an API token; prints it once."""
    wanted = _role(admin, role)
    if database_url is not None:
        if user is None:
            raise _fail("offline (--database-url), give --user")
        from orchestrator.admission.access import Role

        try:
            with offline_store(database_url) as store:
                typer.echo(store.create_token(user, role=Role(wanted) if wanted else None,
                                              label=label))
        except (ServerRunning, ValueError) as exc:
            raise _fail(str(exc)) from None
        return
    made = run_client(url, token, data_dir,
                      lambda c: c.create_token(user=user, role=wanted, label=label))
    typer.echo(made.token)


def _print_tokens(tokens: list[TokenInfo], as_json: bool) -> None:
    if as_json:
        print_json(TokenList(items=tokens))
        return
    typer.echo(f"{'ID':>6}  {'USER':<16} {'CREATED':<25} {'STATE':<8} LABEL")
    for t in tokens:
        typer.echo(f"{t.id:>6}  {t.user:<16} {t.created_at.isoformat(timespec='seconds'):<25} "
                   f"{'revoked' if t.revoked else 'live':<8} {t.label}")


@token_app.command("list")
def token_list(
    user: Annotated[str | None, typer.Option("--user", help="Only this user's (admins).")]
    = None,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked tokens.")] = False,
    url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
    database_url: OfflineOpt = None, as_json: JsonOpt = False,
) -> None:
    """List tokens (ids, users, labels; never the tokens themselves)."""
    if database_url is not None:
        try:
            with offline_store(database_url) as store:
                found = [TokenInfo.model_validate(t)
                         for t in store.list_tokens(user=user, include_revoked=revoked)]
        except ServerRunning as exc:
            raise _fail(str(exc)) from None
    else:
        found = list(run_client(url, token, data_dir, lambda c: c.list_tokens(
            user=user, include_revoked=revoked)).items)
    _print_tokens(found, as_json)


def _revoke_over_api(client: MeshyardClient, *, token_id: int | None,
                     user: str | None) -> list[TokenInfo]:
    if token_id is not None:
        return [client.revoke_token(token_id)]
    live = client.list_tokens(user=user).items
    return [client.revoke_token(t.id) for t in live if t.user == user]


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int | None, typer.Argument(help="Token id (see `token list`).")] = None,
    user: Annotated[str | None, typer.Option("--user", help="Revoke every token of this "
                                             "user.")] = None,
    value: Annotated[str | None, typer.Option("--value", help="Offline only: revoke just the "
                                              "token with this value.")] = None,
    url: UrlOpt = None, token: TokenOpt = None, data_dir: DataDirOpt = None,
    database_url: OfflineOpt = None,
) -> None:
    """Revoke tokens: one by id, or all of a user's. The server stops accepting them at once
    (other replicas within their 5 s token cache)."""
    if database_url is not None:
        if user is None:
            raise _fail("offline (--database-url), give --user (and optionally --value)")
        try:
            with offline_store(database_url) as store:
                n = store.revoke_tokens(user, token=value)
        except (ServerRunning, LookupError) as exc:
            raise _fail(str(exc)) from None
        typer.echo(f"revoked {n} token(s) of {user}")
        return
    if (token_id is None) == (user is None):
        raise _fail("give a token id, or --user to revoke all of a user's tokens")
    done = run_client(url, token, data_dir,
                      lambda c: _revoke_over_api(c, token_id=token_id, user=user))
    who = user or (done[0].user if done else "?")
    typer.echo(f"revoked {len(done)} token(s) of {who}")
