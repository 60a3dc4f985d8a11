"""Restart: stop the server process, start it on the same data dir, nothing is lost.

Runs on the shared session server (SQLite and PostgreSQL), so "everything" is every job and
event the other API tests left there, plus a few made here.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.api.conftest import Server, Users


def _snapshot(client: httpx.Client) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params).json()
        jobs += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    return {"jobs": jobs,
            "details": {j["id"]: client.get(f"/v1/jobs/{j['id']}").json() for j in jobs},
            "events": {j["id"]: client.get(f"/v1/jobs/{j['id']}/events").json() for j in jobs}}


def test_jobs_and_events_survive_a_restart(server: Server, users: Users) -> None:
    with server.client(users.admin) as c:
        ids = [c.post("/v1/jobs", json={"name": f"keep-{i}"},
                      headers={"Idempotency-Key": f"restart-keep-{i}"}).json()["id"]
               for i in range(3)]
        assert c.post(f"/v1/jobs/{ids[0]}/cancel").json()["state"] == "CANCELLED"
        before = _snapshot(c)
    assert set(ids) <= set(before["details"])

    assert server.stop() == 0  # graceful SIGTERM shutdown, exit status 0
    assert not (server.data_dir / "server.json").exists()
    token = server.admin_token
    server.start()
    assert server.admin_token == token  # the admin is not re-created

    with server.client(users.admin) as c:
        after = _snapshot(c)
        assert after == before
        assert after["details"][ids[0]]["state"] == "CANCELLED"
        assert [e["dst"] for e in after["events"][ids[0]]["items"]] == ["QUEUED", "CANCELLED"]
        # a retry after the restart still finds its job
        again = c.post("/v1/jobs", json={"name": "keep-1"},
                       headers={"Idempotency-Key": "restart-keep-1"})
        assert (again.status_code, again.json()["id"]) == (200, ids[1])
    with server.client(users.alice) as alice:  # other users' tokens survive too
        assert alice.get("/v1/jobs").status_code == 200
