"""LeaderLock / LeaderElector on the real databases (SQLite file and the local PostgreSQL).

Two locks in one process stand in for two servers here; test_leader_failover.py uses two
real processes and kill -9.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import create_engine, text

from orchestrator.store.db import upgrade_database
from orchestrator.store.leader import (
    LeaderElector,
    LeaderLock,
    current_leader,
    holder_is_dead_here,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def url(db_url: str) -> str:
    upgrade_database(db_url)  # the SQLite lease lives in the leader_leases table
    return db_url


def _wait_for(predicate, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_only_one_of_two_leads_and_release_hands_over(url: str) -> None:
    a = LeaderLock(url, lease_s=5, holder="a")
    b = LeaderLock(url, lease_s=5, holder="b")
    try:
        assert a.try_acquire() is True and a.is_leader
        assert b.try_acquire() is False and not b.is_leader
        assert a.try_acquire() is True, "renewing a held lock must succeed"
        assert b.try_acquire() is False
        a.release()
        assert not a.is_leader
        assert b.try_acquire() is True
        assert a.try_acquire() is False
    finally:
        a.close()
        b.close()


def test_different_names_do_not_contend(url: str) -> None:
    a = LeaderLock(url, name="scheduler", holder="a")
    b = LeaderLock(url, name="other", holder="b")
    try:
        assert a.try_acquire() and b.try_acquire()
    finally:
        a.close()
        b.close()


def test_sqlite_lease_expires_when_the_leader_stops_renewing(sqlite_url: str) -> None:
    upgrade_database(sqlite_url)
    a = LeaderLock(sqlite_url, lease_s=1.0, holder="a")
    b = LeaderLock(sqlite_url, lease_s=1.0, holder="b")
    try:
        assert a.try_acquire()
        assert not b.try_acquire()
        # `a` stops renewing (a hung or dead process): after the lease, b takes over and a
        # no longer believes it leads, even before it talks to the database again.
        assert _wait_for(b.try_acquire, timeout_s=5)
        assert not a.is_leader
        assert a.try_acquire() is False
    finally:
        a.close()
        b.close()


def test_current_leader_on_sqlite(sqlite_url: str) -> None:
    upgrade_database(sqlite_url)
    a = LeaderLock(sqlite_url, lease_s=5)
    engine = create_engine(sqlite_url)
    try:
        assert current_leader(engine) is None
        assert a.try_acquire()
        assert current_leader(engine) == a.holder
        a.release()
        assert current_leader(engine) is None
    finally:
        a.close()
        engine.dispose()


def test_dead_local_holder_is_replaced_at_once(sqlite_url: str) -> None:
    upgrade_database(sqlite_url)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    ghost = f"{socket.gethostname()}:{dead.stdout.strip()}:deadbeef"
    assert holder_is_dead_here(ghost)
    assert not holder_is_dead_here(f"{socket.gethostname()}:{os.getpid()}:x")
    assert not holder_is_dead_here(f"{socket.gethostname()}:1:x")  # init: alive
    assert not holder_is_dead_here(f"other-host:{dead.stdout.strip()}:x")
    ghost_lock = LeaderLock(sqlite_url, lease_s=600, holder=ghost)  # a long lease, then dies
    b = LeaderLock(sqlite_url, lease_s=600)
    try:
        assert ghost_lock.try_acquire()
        assert b.try_acquire(), "a dead process of this host is not waited out"
    finally:
        b.close()
        ghost_lock.close()


def test_postgres_lock_dies_with_the_session(postgres_url: str) -> None:
    a = LeaderLock(postgres_url, holder="a")
    b = LeaderLock(postgres_url, holder="b")
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        assert a.try_acquire() and not b.try_acquire()
        holder = current_leader(admin)
        assert holder == f"meshyard-leader:scheduler:{socket.gethostname()}:{os.getpid()}"
        with admin.connect() as conn:
            # The leader's session ends (what happens when its process dies).
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = :h"), {"h": holder})
        assert _wait_for(b.try_acquire, timeout_s=5), "standby must take the lock at once"
        assert a.try_acquire() is False, "the old leader notices on its next renewal"
        assert not a.is_leader
    finally:
        a.close()
        b.close()
        admin.dispose()


def test_postgres_leaders_of_two_databases_on_one_server_are_apart(postgres_url: str) -> None:
    """Two deployments sharing a PostgreSQL server, each in its own database: the same
    advisory key, yet each database has its own leader and sees only its own."""
    from tests.postgres import scratch_postgres_database

    with scratch_postgres_database(postgres_url, prefix="meshyard_t_other_") as other_url:
        upgrade_database(other_url)
        here, there = LeaderLock(postgres_url, holder="a"), LeaderLock(other_url, holder="b")
        other = create_engine(other_url, isolation_level="AUTOCOMMIT")
        try:
            assert here.try_acquire()
            assert current_leader(other) is None
            assert there.try_acquire(), "another database's leader must not block this one"
        finally:
            here.close()
            there.close()
            other.dispose()


def test_elector_calls_back_on_election_loss_and_stop(url: str) -> None:
    events: list[str] = []
    lock_a = LeaderLock(url, lease_s=4, holder="a")
    lock_b = LeaderLock(url, lease_s=4, holder="b")
    ea = LeaderElector(lock_a, interval_s=0.1, on_elected=lambda: events.append("a+"),
                       on_lost=lambda: events.append("a-"))
    eb = LeaderElector(lock_b, interval_s=0.1, on_elected=lambda: events.append("b+"),
                       on_lost=lambda: events.append("b-"))
    ea.step()
    eb.step()
    assert events == ["a+"] and ea.is_leader and not eb.is_leader
    eb.start()
    ea.start()
    try:
        time.sleep(0.5)
        assert events == ["a+"], "a renews; b keeps waiting"
        ea.stop()  # releases: b is elected within about one interval
        assert _wait_for(lambda: eb.is_leader, timeout_s=5)
        assert events == ["a+", "a-", "b+"]
    finally:
        ea.stop()
        eb.stop()
    assert events == ["a+", "a-", "b+", "b-"]


def test_elector_survives_a_failing_callback(sqlite_url: str) -> None:
    upgrade_database(sqlite_url)

    def boom() -> None:
        raise RuntimeError("callback bug")

    elector = LeaderElector(LeaderLock(sqlite_url, lease_s=3), interval_s=0.1, on_elected=boom)
    elector.step()
    assert elector.is_leader
    elector.stop()


def test_interval_must_fit_the_lease(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="half of the lease"):
        LeaderElector(LeaderLock(sqlite_url, lease_s=1.0), interval_s=1.0)


def test_unsupported_backend_names_the_fix() -> None:
    with pytest.raises(ValueError, match="MESHYARD_DATABASE_URL"):
        LeaderLock("mysql://u@localhost/db")


def test_concurrent_threads_one_winner(url: str) -> None:
    locks = [LeaderLock(url, lease_s=5, holder=f"h{i}") for i in range(6)]
    results: list[bool] = [False] * len(locks)
    barrier = threading.Barrier(len(locks))

    def contend(i: int) -> None:
        barrier.wait()
        results[i] = locks[i].try_acquire()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(locks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sum(results) == 1, results
    finally:
        for lock in locks:
            lock.close()


def test_replicas_starting_together_migrate_once(postgres_url: str) -> None:
    """Two control-plane replicas start on a fresh database at once (Kubernetes): the
    migrations run under an advisory lock, so neither fails on the other's CREATE TABLE."""
    code = "import sys; from orchestrator.store.db import upgrade_database; " \
           "upgrade_database(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, postgres_url],
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            errors.append(err.strip().splitlines()[-1:])
    assert errors == []
