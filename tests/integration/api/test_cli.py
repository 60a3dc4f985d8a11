"""The CLI end to end against a real server: submit, list, status, events, cancel, tokens."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.integration.api.conftest import REPO, Server, run_cli

# The CLI is exercised once, on the shared SQLite server (the HTTP paths are the same on both
# databases and covered there); each command is its own process, as a user runs it.
ON_SQLITE = pytest.mark.parametrize("server", ["sqlite"], indirect=True)


@ON_SQLITE
def test_cli_job_commands_find_server_through_data_dir(server: Server, tmp_path: Path) -> None:
    d = server.data_dir
    name = "cli-" + secrets.token_hex(4)
    spec = tmp_path / "job.yaml"
    spec.write_text((REPO / "examples" / "quickstart.yaml").read_text()
                    .replace("name: quickstart-ddp", f"name: {name}"))
    assert name in spec.read_text()
    out = run_cli("submit", str(spec), "--submission-id", name, "--json", data_dir=d)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["created"] is True and job["state"] == "QUEUED"

    again = run_cli("submit", str(spec), "--submission-id", name, data_dir=d)
    assert again.returncode == 0 and f"{job['id']} already submitted" in again.stdout

    listed = run_cli("list", "--name", name, data_dir=d)
    assert listed.returncode == 0 and job["id"] in listed.stdout and "QUEUED" in listed.stdout

    status = run_cli("status", job["id"], data_dir=d)
    assert status.returncode == 0 and "state:    QUEUED" in status.stdout

    cancelled = run_cli("cancel", job["id"], data_dir=d)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"{job['id']} CANCELLED"

    events = run_cli("events", job["id"], data_dir=d)
    assert events.returncode == 0
    assert "  -> QUEUED [SUBMITTED]" in events.stdout
    assert "QUEUED -> CANCELLED [USER_CANCELLED]" in events.stdout

    only = run_cli("list", "--state", "cancelled", "--name", name, "--json", data_dir=d)
    assert [j["id"] for j in json.loads(only.stdout)["items"]] == [job["id"]]


@ON_SQLITE
def test_cli_uses_url_and_token_from_env_and_reports_errors(server: Server,
                                                            tmp_path: Path) -> None:
    token = server.create_token("carol")
    env = {"MESHYARD_URL": server.url, "MESHYARD_TOKEN": token}
    empty = tmp_path / "elsewhere"  # no server.json, no admin.token here
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nparallelism:\n  tp: 3\n")
    out = run_cli("submit", str(bad), data_dir=empty, env=env)
    assert out.returncode == 1
    assert "HTTP 422" in out.stderr and "parallelism.tp: tp=3 does not divide" in out.stderr

    missing = run_cli("status", "job-doesnotexist", data_dir=empty, env=env)
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr

    denied = run_cli("list", data_dir=empty, env={**env, "MESHYARD_TOKEN": "msy_wrong"})
    assert denied.returncode == 1 and "HTTP 401" in denied.stderr

    down = run_cli("list", data_dir=empty, env={**env, "MESHYARD_URL": "http://127.0.0.1:9"})
    assert down.returncode == 2 and "cannot reach the server" in down.stderr


def test_token_create_and_db_upgrade_work_on_the_database(tmp_path: Path) -> None:
    d = tmp_path / "fresh"
    up = run_cli("db", "upgrade", data_dir=d)
    assert up.returncode == 0 and (d / "meshyard.db").exists()
    offline = ("--database-url", f"sqlite:///{d / 'meshyard.db'}")  # the offline bootstrap
    made = run_cli("token", "create", "--user", "dave", "--admin", *offline, data_dir=d)
    assert made.returncode == 0 and made.stdout.strip().startswith("msy_")

    from orchestrator.store import open_store

    store = open_store(f"sqlite:///{d / 'meshyard.db'}", migrate=False)
    try:
        user = store.authenticate(made.stdout.strip())
        assert user is not None and user.name == "dave" and user.is_admin
    finally:
        store.close()


def test_token_revoke_on_the_database(tmp_path: Path) -> None:
    d = tmp_path / "fresh"
    offline = ("--database-url", f"sqlite:///{d / 'meshyard.db'}")  # the offline bootstrap
    made = run_cli("token", "create", "--user", "erin", *offline, data_dir=d)
    assert made.returncode == 0
    token = made.stdout.strip()
    gone = run_cli("token", "revoke", "--user", "erin", *offline, data_dir=d)
    assert gone.returncode == 0 and "revoked 1 token(s) of erin" in gone.stdout
    missing = run_cli("token", "revoke", "--user", "nobody", *offline, data_dir=d)
    assert missing.returncode == 2 and "no user named 'nobody'" in missing.stderr

    from orchestrator.store import open_store

    store = open_store(f"sqlite:///{d / 'meshyard.db'}", migrate=False)
    try:
        assert store.authenticate(token) is None
    finally:
        store.close()


@ON_SQLITE
def test_cli_submit_working_dir_ships_the_code_once(server: Server, tmp_path: Path) -> None:
    d = server.data_dir
    example = REPO / "examples" / "byo" / "ddp"
    name = "byo-" + secrets.token_hex(4)
    spec = tmp_path / "spec.yaml"
    spec.write_text((example / "spec.yaml").read_text().replace("name: byo-ddp", f"name: {name}"))
    out = run_cli("submit", str(spec), "--working-dir", str(example), "--json", data_dir=d)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    ref = job["spec"]["entrypoint"]["working_dir"]
    digest = ref.removeprefix("package:sha256:")
    assert (d / "packages" / f"{digest}.zip").is_file()
    again = run_cli("submit", str(spec), "--working-dir", str(example), "--json", data_dir=d)
    assert json.loads(again.stdout)["spec"]["entrypoint"]["working_dir"] == ref  # same bytes
    no_entry = run_cli("submit", str(REPO / "examples" / "quickstart.yaml"), "--working-dir",
                       str(example), data_dir=d)
    assert no_entry.returncode == 1 and "has no `entrypoint`" in no_entry.stderr
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "weights.bin", "wb") as f:
        f.truncate(101 * 2**20)  # sparse: costs no disk
    over = run_cli("submit", str(spec), "--working-dir", str(big), data_dir=d)
    assert over.returncode == 1 and "weights.bin (101.0 MiB)" in over.stderr
    assert "cap" in over.stderr and ".gitignore" in over.stderr
