"""One active scheduler: a leader lock on the database.

Two `meshyard serve` processes on one database must not both schedule. The one that holds
the lock runs the scheduler and the poller; the other serves reads and retries every second.

- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) taken on a dedicated
  connection that stays open for as long as the process leads. When the process dies, the
  kernel closes its socket, the server ends the session and the lock is gone: a standby takes
  over on its next retry (about a second), with no expiry to wait for.
- SQLite (the single-machine embedded default): a row in `leader_leases` with an expiry,
  renewed every retry; a compare-and-set UPDATE takes it when it is free, ours, or expired.
  A dead leader is replaced after at most `lease_s`, at once when it was a process of this
  host that is provably gone (a `meshyard serve` killed and restarted).

Either way `is_leader` turns False by itself when the lock could not be confirmed for
`lease_s` (a stuck renewal must not leave two leaders believing they lead).

    lock = LeaderLock(engine, name="scheduler")
    elector = LeaderElector(lock, on_elected=start_loops, on_lost=stop_loops)
    elector.start()            # ... elector.stop() releases the lock
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from sqlalchemy import Connection, Engine, create_engine, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from orchestrator.store.models import LeaderLease

log = logging.getLogger("meshyard.leader")
DEFAULT_LEASE_S = 10.0
# libpq keepalives: a leader cut off from the database notices within ~10 s even when no
# packet comes back (the renewal's SELECT 1 would otherwise wait for TCP's own timeout).
_PG_CONNECT_ARGS = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                    "keepalives_count": 3, "connect_timeout": 5}


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for `pg_try_advisory_lock` (same name → same key)."""
    digest = hashlib.sha256(f"meshyard.leader:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def application_name(name: str) -> str:
    """The leader session's PostgreSQL application_name: lock name, host and pid (63 max)."""
    return f"meshyard-leader:{name}:{socket.gethostname()}:{os.getpid()}"[:63]


def current_leader(engine: Engine, *, name: str = "scheduler") -> str | None:
    """Who holds the lock now: PostgreSQL, the holder session's application_name
    (`meshyard-leader:<name>:<host>:<pid>`) in this database (another database on the same
    server has its own lock of the same key); SQLite, the unexpired lease's holder
    (`<host>:<pid>:<nonce>`). None when nobody leads."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            key = advisory_key(name)
            return conn.execute(text(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid::bigint = :hi AND l.objid::bigint = :lo AND l.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"),
                {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF}).scalar()
        return conn.execute(select(LeaderLease.holder).where(
            LeaderLease.name == name, LeaderLease.expires_at >= time.time())).scalar()


def is_shared_database(url: str) -> bool:
    """False for an in-memory SQLite database: only this process can see it, so it leads
    without a lock (a lease table there would be a different, empty database)."""
    u = make_url(url)
    return not (u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:"))


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaderLock:
    """A named leader lock. `try_acquire()` takes or renews it; `release()` gives it up.

    Not thread-safe by itself: one thread (the elector) calls try_acquire/release; any thread
    may read `is_leader`.
    """

    def __init__(self, engine_or_url: Engine | str, *, name: str = "scheduler",
                 lease_s: float = DEFAULT_LEASE_S, holder: str | None = None) -> None:
        url = (engine_or_url.url.render_as_string(hide_password=False)
               if isinstance(engine_or_url, Engine) else engine_or_url)
        self.url = make_url(url)
        self.name = name
        self.lease_s = lease_s
        self.holder = holder or default_holder()
        self.backend = self.url.get_backend_name()
        self._valid_until = 0.0  # monotonic; is_leader is False after it
        self._conn: Connection | None = None
        self._engine = self._make_engine()

    def _make_engine(self) -> Engine:
        # A private NullPool engine: the lock's connection is never handed back to a pool
        # (a pooled connection would keep the advisory lock alive in someone else's hands).
        if self.backend == "postgresql":
            url = self.url
            if url.drivername == "postgresql":
                url = url.set(drivername="postgresql+psycopg")
            # pg_stat_activity then says who leads (see `current_leader`).
            args = dict(_PG_CONNECT_ARGS, application_name=application_name(self.name))
            return create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT",
                                 connect_args=args)
        if self.backend == "sqlite":
            return create_engine(self.url, poolclass=NullPool,
                                 connect_args={"check_same_thread": False, "timeout": 5})
        raise ValueError(f"leader lock supports postgresql and sqlite, not {self.backend!r}; "
                         "set MESHYARD_DATABASE_URL to one of them")

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def try_acquire(self) -> bool:
        """Takes the lock, or confirms (renews) it when held. Returns `is_leader`."""
        started = time.monotonic()
        try:
            ok = self._pg_acquire() if self.backend == "postgresql" else self._lease_acquire()
        except SQLAlchemyError as exc:
            log.warning("leader lock %r: database error: %s", self.name, exc)
            self._drop_connection()
            ok = False
        # Validity counts from before the round trip: never believe longer than the lease.
        self._valid_until = started + self.lease_s if ok else 0.0
        return ok

    def release(self) -> None:
        """Gives the lock up (idempotent). A standby can take it on its next retry."""
        self._valid_until = 0.0
        try:
            if self.backend == "postgresql":
                if self._conn is not None:
                    self._conn.execute(text("SELECT pg_advisory_unlock(:k)"),
                                       {"k": advisory_key(self.name)})
            else:
                with self._engine.begin() as conn:
                    conn.execute(update(LeaderLease).where(
                        LeaderLease.name == self.name, LeaderLease.holder == self.holder,
                    ).values(expires_at=0.0))
        except SQLAlchemyError as exc:
            log.warning("leader lock %r: release failed (%s); it ends with the session/lease",
                        self.name, exc)
        finally:
            self._drop_connection()

    def close(self) -> None:
        self.release()
        self._engine.dispose()

    # -- PostgreSQL: session advisory lock -------------------------------------------------
    def _pg_acquire(self) -> bool:
        key = advisory_key(self.name)
        if self._conn is not None:
            # Held (the connection is kept only with the lock): the lock lives as long as
            # this session, so a round trip proves it.
            self._conn.execute(text("SELECT 1"))
            return True
        if self._conn is None:
            self._conn = self._engine.connect()
        got = self._conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
        if not got:
            self._drop_connection()  # standbys keep no idle session open between retries
        return bool(got)

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # really close it: the session (and any lock) ends
                conn.close()
            except SQLAlchemyError:
                pass

    # -- SQLite (and any other SQL): a lease row -------------------------------------------
    def _lease_acquire(self) -> bool:
        now = time.time()
        expires = now + self.lease_s
        with self._engine.begin() as conn:
            # One atomic compare-and-set: free (expired), or already ours.
            taken = conn.execute(update(LeaderLease).where(
                LeaderLease.name == self.name,
                (LeaderLease.holder == self.holder) | (LeaderLease.expires_at < now),
            ).values(holder=self.holder, expires_at=expires)).rowcount
        if taken == 1:
            return True
        if self._take_from_dead_local_holder(expires):
            return True
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(LeaderLease).values(
                    name=self.name, holder=self.holder, expires_at=expires))
            return True
        except IntegrityError:
            return False  # someone holds an unexpired lease


    def _take_from_dead_local_holder(self, expires: float) -> bool:
        """A holder on this host whose process is gone (`meshyard serve` killed and started
        again) need not be waited out: take its lease at once. Only for pids we can prove
        dead here; anything else waits for the expiry."""
        with self._engine.begin() as conn:
            holder = conn.execute(select(LeaderLease.holder).where(
                LeaderLease.name == self.name)).scalar()
            if holder is None or not holder_is_dead_here(holder):
                return False
            taken = conn.execute(update(LeaderLease).where(
                LeaderLease.name == self.name, LeaderLease.holder == holder,
            ).values(holder=self.holder, expires_at=expires)).rowcount
        if taken == 1:
            log.info("leader lock %r: took over from %s (process gone)", self.name, holder)
        return taken == 1


def holder_is_dead_here(holder: str) -> bool:
    """True when `holder` (host:pid:nonce) names a process of this host that no longer runs."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # another lock object of this very process: alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by someone else
    return False


class LeaderElector:
    """Keeps trying to lead; calls `on_elected()` when it becomes leader and `on_lost()` when
    it stops being one. Callbacks run on the elector thread and must not block for long.

    The elector only decides; whoever passes the callbacks (the runtime) acts on them.
    """

    def __init__(self, lock: LeaderLock, *, interval_s: float = 1.0,
                 on_elected: Callable[[], object] | None = None,
                 on_lost: Callable[[], object] | None = None) -> None:
        if interval_s * 2 > lock.lease_s:
            raise ValueError(f"interval_s={interval_s} must be at most half of the lease "
                             f"({lock.lease_s} s), or the lease lapses between renewals")
        self.lock = lock
        self.interval_s = interval_s
        self._on_elected, self._on_lost = on_elected, on_lost
        self._leading = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"meshyard-leader-{lock.name}",
                                        daemon=True)

    @property
    def is_leader(self) -> bool:
        return self._leading and self.lock.is_leader

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops retrying and releases the lock; calls `on_lost()` if it was leading."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        else:  # never started (tests drive step() by hand)
            self._finish()

    def step(self) -> None:
        """One round: acquire/renew, then fire a callback on a change (tests call it)."""
        held = self.lock.try_acquire()
        if held and not self._leading:
            self._leading = True
            log.info("leader lock %r: this process (%s) leads", self.lock.name, self.lock.holder)
            self._call(self._on_elected)
        elif not held and self._leading:
            self._leading = False
            log.warning("leader lock %r: leadership lost", self.lock.name)
            self._call(self._on_lost)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.interval_s)
        self._finish()

    def _finish(self) -> None:
        if self._leading:
            self._leading = False
            self._call(self._on_lost)
        self.lock.close()

    @staticmethod
    def _call(fn: Callable[[], object] | None) -> None:
        if fn is None:
            return
        try:
            fn()
        except Exception:  # noqa: BLE001 - the elector survives a failing callback
            log.exception("leader callback failed")
