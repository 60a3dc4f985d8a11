"""Two real `meshyard serve` processes on one PostgreSQL and one local Ray cluster.

One leads (schedules and polls); the other serves reads. kill -9 the leader while two jobs
run and a third waits for their GPUs: the standby takes the lock within about a second,
reattaches to the running jobs (their steps go on advancing in the same attempt, and a cancel
sent to it stops them), places the waiting one when GPUs free, and every job is placed exactly
once (one QUEUED→PLACING transition, one Ray placement group per attempt).

The two running jobs train until cancelled, so the state the kill needs (two RUNNING, one
QUEUED) holds until the test ends it, however slowly the host starts their workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray loads: 127.0.0.1 only

import pytest  # noqa: E402
import ray  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

from api.client import MeshyardClient  # noqa: E402
from orchestrator.runtime.events import pg_name  # noqa: E402
from orchestrator.store.leader import current_leader  # noqa: E402
from tests.integration.runtime.conftest import (  # noqa: E402
    serve_url,
    start_serve,
    stop_serve,
    tiny_spec,
    write_cluster_file,
)
from tests.support.jobs import until  # noqa: E402

TOKEN = "leader-serve-test-admin-token"
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]


def _leader_pid(engine: Any) -> int | None:
    holder = current_leader(engine)
    return int(holder.rsplit(":", 1)[1]) if holder else None


def test_standby_takes_over_and_places_each_job_once(ray_cluster, ray_connected, postgres_url,
                                                     tmp_path):
    cluster_file = write_cluster_file(tmp_path / "cluster.yaml")
    engine = create_engine(postgres_url)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        a = start_serve(tmp_path / "a", token=TOKEN, address=ray_cluster.address,
                        cluster_file=cluster_file, extra=("--database-url", postgres_url))
        procs.append(a)
        url_a = serve_url(tmp_path / "a", a, token=TOKEN, timeout_s=90)
        until(lambda: _leader_pid(engine) == a.pid, timeout_s=30, what="a leads", poll_s=0.1)
        b = start_serve(tmp_path / "b", token=TOKEN, address=ray_cluster.address,
                        cluster_file=cluster_file, extra=("--database-url", postgres_url))
        procs.append(b)
        url_b = serve_url(tmp_path / "b", b, token=TOKEN, timeout_s=90)
        assert _leader_pid(engine) == a.pid, "the second server must stand by"

        # 4 GPUs: two 2-rank jobs run until cancelled, the third waits for their GPUs.
        long_run = {"steps": 100_000}
        specs = [tiny_spec("run-0", training=long_run, checkpoint={"every_steps": 1000}),
                 tiny_spec("run-1", training=long_run, checkpoint={"every_steps": 1000}),
                 tiny_spec("waits", training={"steps": 20})]
        with MeshyardClient(url_a, TOKEN) as client:
            ids = [client.submit(s).id for s in specs]
            until(lambda: _two_running(client, ids), timeout_s=180, what="two jobs running")
        running, waiting = ids[:2], ids[2]
        with MeshyardClient(url_b, TOKEN) as client:  # the standby serves reads
            assert _two_running(client, ids)

        killed_at = time.monotonic()
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        until(lambda: _leader_pid(engine) == b.pid, timeout_s=30, what="b leads", poll_s=0.05)
        takeover = time.monotonic() - killed_at
        print(f"\ntwo `meshyard serve` on PostgreSQL: standby leads {takeover:.2f} s after "
              "kill -9 of the leader")

        with MeshyardClient(url_b, TOKEN) as client:
            # b polls the jobs it reattached to: their steps advance past what a last reported.
            seen = {j: client.get_job(j).last_step or 0 for j in running}
            until(lambda: all((client.get_job(j).last_step or 0) > seen[j] + 2 for j in running),
                  timeout_s=120, what="steps reported under the new leader")
            assert client.get_job(waiting).state.value == "QUEUED", "no GPUs are free yet"
            client.cancel(running[0])
            until(lambda: client.get_job(waiting).state.value == "SUCCEEDED", timeout_s=180,
                  what="the waiting job placed by b and done")
            assert client.get_job(running[1]).state.value == "RUNNING"
            client.cancel(running[1])
            final = until(lambda: _all_done(client, ids), timeout_s=60, what="all jobs ended")
            placements = {j: [e for e in client.events(j)
                              if e.kind == "state" and _val(e.dst) == "PLACING"] for j in ids}
            attempts = {j: [a_.state for a_ in client.attempts(j).items] for j in ids}
        assert final == {running[0]: "CANCELLED", running[1]: "CANCELLED",
                         waiting: "SUCCEEDED"}, (final, attempts)
        for j in ids:
            assert len(placements[j]) == 1, f"{j} placed {len(placements[j])} times"
        assert attempts == {running[0]: ["CANCELLED"], running[1]: ["CANCELLED"],
                            waiting: ["SUCCEEDED"]}, attempts
        groups = [pg["name"] for pg in ray.util.placement_group_table().values()]
        for j in ids:
            assert groups.count(pg_name(j, 1)) == 1, f"{j}: {groups.count(pg_name(j, 1))} groups"
        assert takeover < 20, "generous bound: the standby took over"
    finally:
        for proc in procs:
            stop_serve(proc)
        engine.dispose()


def _val(x: Any) -> str:
    return str(x.value) if hasattr(x, "value") else str(x)


def _two_running(client: MeshyardClient, ids: list[str]) -> bool:
    # Kill only when nothing is mid-placement: PLACING/STARTING belong to the old leader.
    return [client.get_job(j).state.value for j in ids] == ["RUNNING", "RUNNING", "QUEUED"]


def _all_done(client: MeshyardClient, ids: list[str]) -> dict[str, str] | None:
    states = {j: client.get_job(j).state.value for j in ids}
    done = all(s in ("SUCCEEDED", "FAILED", "CANCELLED") for s in states.values())
    return states if done else None
