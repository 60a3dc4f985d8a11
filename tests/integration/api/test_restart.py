"""Restart: stop the server process, start it on the same data dir, nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.api.conftest import Server, database


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_jobs_and_events_survive_a_restart(kind: str, tmp_path: Path) -> None:
    with database(kind) as url:
        srv = Server(data_dir=tmp_path / "data", database_url=url).start()
        try:
            token = srv.admin_token
            with srv.client(token) as c:
                ids = [c.post("/v1/jobs", json={"name": f"keep-{i}"},
                              headers={"Idempotency-Key": f"keep-{i}"}).json()["id"]
                       for i in range(5)]
                c.post(f"/v1/jobs/{ids[0]}/cancel")
                before_jobs = {i: c.get(f"/v1/jobs/{i}").json() for i in ids}
                before_events = {i: c.get(f"/v1/jobs/{i}/events").json() for i in ids}
            first_url = srv.url
            assert srv.stop() == 0  # graceful SIGTERM shutdown
            assert not (srv.data_dir / "server.json").exists()

            srv.start()
            assert srv.admin_token == token  # the admin is not re-created
            with srv.client(token) as c:
                assert {i: c.get(f"/v1/jobs/{i}").json() for i in ids} == before_jobs
                assert {i: c.get(f"/v1/jobs/{i}/events").json() for i in ids} == before_events
                assert before_jobs[ids[0]]["state"] == "CANCELLED"
                # a retry after the restart still finds the job
                again = c.post("/v1/jobs", json={"name": "keep-1"},
                               headers={"Idempotency-Key": "keep-1"})
                assert (again.status_code, again.json()["id"]) == (200, ids[1])
            assert srv.starts == 2 and srv.url.startswith("http://127.0.0.1:")
            assert first_url.startswith("http://127.0.0.1:")
        finally:
            srv.stop()
