"""Tokens over the API, the CLI that uses it, the offline bootstrap, and log streams that end
with their token (real server, both databases).

By hand, before: `meshyard token create` wrote into whatever database its working directory
pointed at and printed a token the running server did not know (on a shared SQLite file it
also helped corrupt the database); a log stream kept flowing after its token was revoked; one
user could open any number of streams.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx

from orchestrator.store.leader import LeaderLock
from tests.integration.api.conftest import Server, Users, run_cli


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _works(server: Server, token: str) -> bool:
    with server.client(token) as http:
        return http.get("/v1/jobs").status_code == 200


def test_tokens_api_admins_manage_any_users_their_own(server: Server, users: Users) -> None:
    fred = _name("fred")
    with server.client(users.admin) as admin:
        made = admin.post("/v1/tokens", json={"user": fred, "label": "ci"})
        assert made.status_code == 201, made.text
        fred_token, fred_id = made.json()["token"], made.json()["id"]
        assert made.json()["role"] == "user" and made.json()["user"] == fred
    assert _works(server, fred_token)
    with server.client(fred_token) as http:
        own = http.post("/v1/tokens", json={"label": "laptop"}).json()
        assert own["user"] == fred and own["role"] == "user"
        assert http.post("/v1/tokens", json={"user": "alice"}).status_code == 403
        assert http.post("/v1/tokens", json={"role": "admin"}).status_code == 403
        listed = http.get("/v1/tokens").json()["items"]
        assert {t["user"] for t in listed} == {fred} and {t["id"] for t in listed} >= {
            fred_id, own["id"]}
        assert "token" not in listed[0]  # never the token itself
        assert http.get("/v1/tokens", params={"user": "alice"}).status_code == 403
        alices = [t["id"] for t in httpx.get(server.url + "/v1/tokens", headers={
            "Authorization": f"Bearer {users.admin}"}, params={"user": "alice"}).json()["items"]]
        assert alices and http.delete(f"/v1/tokens/{alices[0]}").status_code == 404
        assert _works(server, users.alice)
        gone = http.delete(f"/v1/tokens/{own['id']}")
        assert gone.status_code == 200 and gone.json()["revoked"] is True
    assert not _works(server, own["token"])  # at once: this server forgot it
    assert _works(server, fred_token)


def test_token_cli_goes_over_the_api(server: Server, users: Users, tmp_path: Path) -> None:
    gina = _name("gina")
    env = {"MESHYARD_URL": server.url, "MESHYARD_TOKEN": users.admin}
    empty = tmp_path / "elsewhere"  # no database, no server.json here: nothing to write into
    made = run_cli("token", "create", "--user", gina, "--label", "cli", data_dir=empty, env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("msy_") and _works(server, token)  # the running server knows it
    assert not (empty / "meshyard.db").exists()
    listed = run_cli("token", "list", "--user", gina, data_dir=empty, env=env)
    assert listed.returncode == 0 and gina in listed.stdout and "cli" in listed.stdout
    mine = run_cli("token", "create", data_dir=empty, env={**env, "MESHYARD_TOKEN": token})
    assert mine.returncode == 0 and _works(server, mine.stdout.strip())
    gone = run_cli("token", "revoke", "--user", gina, data_dir=empty, env=env)
    assert gone.returncode == 0 and f"revoked 2 token(s) of {gina}" in gone.stdout
    assert not _works(server, token)


def test_offline_bootstrap_is_refused_while_a_server_runs(server: Server, users: Users,
                                                          tmp_path: Path) -> None:
    url = server.database_url or f"sqlite:///{server.data_dir / 'meshyard.db'}"
    mallory = _name("mallory")
    lease = LeaderLock(url, name="scheduler")  # what a scheduling server holds
    try:
        assert lease.try_acquire()
        out = run_cli("token", "create", "--user", mallory, "--database-url", url,
                      data_dir=tmp_path)
        assert out.returncode == 2, out.stdout
        assert "running server owns its database" in out.stderr and "MESHYARD_URL" in out.stderr
    finally:
        lease.close()
    if server.database_url is None:
        # SQLite: the serving process itself (its server.json, no lease) is enough.
        out = run_cli("token", "create", "--user", mallory, "--database-url", url,
                      data_dir=tmp_path)
        assert out.returncode == 2 and f"pid {server.proc.pid}" in out.stderr  # type: ignore[union-attr]
    with server.client(users.admin) as admin:
        names = {u["name"] for u in admin.get("/v1/users").json()["items"]}
    assert mallory not in names


def _follow_until_closed(server: Server, token: str, job_id: str, done: threading.Event,
                         lines: list[str]) -> None:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                      timeout=httpx.Timeout(30, read=60)) as http, \
            http.stream("GET", f"/v1/jobs/{job_id}/logs/follow") as r:
        lines.append(str(r.status_code))
        for line in r.iter_lines():
            lines.append(line)
    done.set()


def test_a_log_stream_ends_when_its_token_is_revoked(server: Server, users: Users) -> None:
    with server.client(users.admin) as admin:
        made = admin.post("/v1/tokens", json={"user": "alice", "label": "stream"}).json()
    with server.client(users.alice) as alice:  # queued forever (no scheduler): endless stream
        job = alice.post("/v1/jobs", json={"name": _name("follow")}).json()["id"]
    done, lines = threading.Event(), []
    reader = threading.Thread(target=_follow_until_closed, daemon=True,
                              args=(server, made["token"], job, done, lines))
    reader.start()
    deadline = time.monotonic() + 10
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines == ["200"]
    assert not done.wait(1.0)  # streaming, and would go on
    with server.client(users.admin) as admin:
        assert admin.delete(f"/v1/tokens/{made['id']}").status_code == 200
    # The stream re-checks its token every RECHECK_S (2 s); the wait is a generous bound.
    assert done.wait(15), "the stream outlived its token"


def test_streams_per_user_are_capped(server: Server, users: Users) -> None:
    name = _name("streamer")
    token = server.create_token(name)
    headers = {"Authorization": f"Bearer {token}"}
    with server.client(token) as http:
        job = http.post("/v1/jobs", json={"name": "s"}).json()["id"]
    path = f"{server.url}/v1/jobs/{job}/logs/follow"
    with ExitStack() as stack:
        clients = [stack.enter_context(httpx.Client(headers=headers, timeout=30))
                   for _ in range(8)]
        streams = [stack.enter_context(c.stream("GET", path)) for c in clients]
        assert [s.status_code for s in streams] == [200] * 8
        with httpx.Client(headers=headers, timeout=30) as ninth:
            r = ninth.get(path)
            assert r.status_code == 429, r.text
            assert (r.json()["quota"], r.json()["limit"]) == ("max_streams_per_user", 8)
            with server.client(users.alice) as alice:  # others are not affected
                other = alice.post("/v1/jobs", json={"name": "o"}).json()["id"]
                with alice.stream("GET", f"/v1/jobs/{other}/logs/follow") as s:
                    assert s.status_code == 200
            streams[0].close()
            clients[0].close()
            deadline, status = time.monotonic() + 15, 429
            while status == 429 and time.monotonic() < deadline:
                with ninth.stream("GET", path) as s:
                    status = s.status_code
                time.sleep(0.2)
            assert status == 200  # the closed stream's slot came back
