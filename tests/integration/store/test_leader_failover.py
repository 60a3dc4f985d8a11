"""Two real processes contend for the scheduler lock; kill -9 the leader; the standby takes
over and no job is claimed twice.

Each process runs a fake scheduler: while it leads, it claims the lowest unclaimed job with
a deliberately racy read-then-write (so two leaders at once would show up as double claims)
and records the claim. The parent kills the leader with SIGKILL mid-run and measures the
time until the standby reports itself elected.

Run a child by hand: python tests/integration/test_leader_failover.py URL HOLDER LEASE_S
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

ROOT = Path(__file__).resolve().parents[3]
JOBS = 80

pytestmark = pytest.mark.integration


def run_child(url: str, holder: str, lease_s: float) -> None:
    from orchestrator.store.leader import LeaderElector, LeaderLock

    engine = create_engine(url)
    leading = threading.Event()  # set after the election is recorded: claims come later

    def elected() -> None:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO t_elected (holder, at) VALUES (:h, :t)"),
                         {"h": holder, "t": time.time()})
        leading.set()

    elector = LeaderElector(LeaderLock(url, holder=holder, lease_s=lease_s), interval_s=1.0,
                            on_elected=elected, on_lost=leading.clear)
    elector.start()
    print("ready", flush=True)
    while True:
        if not (leading.is_set() and elector.is_leader):
            time.sleep(0.05)
            continue
        with engine.begin() as conn:
            job = conn.execute(text(
                "SELECT min(id) FROM t_jobs WHERE claimed_by IS NULL")).scalar()
            if job is None:
                time.sleep(0.05)
                continue
            time.sleep(0.01)  # widen the read→write window a second leader would race in
            conn.execute(text("INSERT INTO t_claims (job, holder, at) VALUES (:j, :h, :t)"),
                         {"j": job, "h": holder, "t": time.time()})
            conn.execute(text("UPDATE t_jobs SET claimed_by = :h WHERE id = :j"),
                         {"j": job, "h": holder})
        time.sleep(0.03)


def _setup(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t_jobs (id INTEGER PRIMARY KEY, claimed_by TEXT)"))
        conn.execute(text("CREATE TABLE t_claims (job INTEGER, holder TEXT, at FLOAT)"))
        conn.execute(text("CREATE TABLE t_elected (holder TEXT, at FLOAT)"))
        conn.execute(text("INSERT INTO t_jobs (id) VALUES (:i)"),
                     [{"i": i} for i in range(JOBS)])


def _spawn(url: str, holder: str, lease_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, url, holder, str(lease_s)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _wait(engine: Engine, sql: str, *, until: int, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    value = 0
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            value = int(conn.execute(text(sql)).scalar() or 0)
        if value >= until:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out: {sql} = {value} < {until}")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_kill_leader_standby_takes_over_no_double_claims(
        backend: str, request: pytest.FixtureRequest) -> None:
    from orchestrator.store.db import upgrade_database

    url = request.getfixturevalue(f"{backend}_url")
    upgrade_database(url)
    lease_s = 3.0 if backend == "sqlite" else 10.0  # PG: the lock ends with the session
    engine = create_engine(url)
    _setup(engine)
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(_spawn(url, "a", lease_s))
        _wait(engine, "SELECT count(*) FROM t_elected WHERE holder = 'a'", until=1)
        procs.append(_spawn(url, "b", lease_s))
        _wait(engine, "SELECT count(*) FROM t_claims", until=15)
        killed_at = time.time()
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        _wait(engine, "SELECT count(*) FROM t_elected WHERE holder = 'b'", until=1)
        _wait(engine, "SELECT count(*) FROM t_jobs WHERE claimed_by IS NOT NULL", until=JOBS,
              timeout_s=60)
        with engine.connect() as conn:
            elected_b = conn.execute(text(
                "SELECT at FROM t_elected WHERE holder = 'b'")).scalar_one()
            claims = conn.execute(text("SELECT job, holder, at FROM t_claims")).all()
        takeover = elected_b - killed_at
        print(f"\n[{backend}] takeover after kill -9: {takeover:.2f} s "
              f"(lease {lease_s:g} s, retry 1 s); claims a={sum(c.holder == 'a' for c in claims)}"
              f" b={sum(c.holder == 'b' for c in claims)}")
        jobs = [c.job for c in claims]
        assert sorted(jobs) == list(range(JOBS)), "every job claimed exactly once"
        assert all(c.at < killed_at for c in claims if c.holder == "a")
        assert all(c.at >= elected_b for c in claims if c.holder == "b"), \
            "the standby claimed nothing while the leader was alive"
        assert takeover < lease_s + 10, "generous bound: the standby took over"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        engine.dispose()


if __name__ == "__main__":
    run_child(sys.argv[1], sys.argv[2], float(sys.argv[3]))
