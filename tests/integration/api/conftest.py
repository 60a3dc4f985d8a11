"""A real `meshyard serve` (uvicorn on 127.0.0.1, its own process) on SQLite or PostgreSQL.

`server` is session-scoped (a server start costs seconds on a loaded 2-core machine) and
parametrized over both databases; PostgreSQL runs when tests/postgres.py finds a server (a
fresh database for the session, dropped afterwards). Tests on the shared server create their
own uniquely named jobs and users, so they do not depend on each other or on order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

CLI = [sys.executable, "-c", "from api.cli import main; main()"]
REPO = Path(__file__).resolve().parents[3]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without MESHYARD_* settings that would leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHYARD_")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env.update(extra)
    return env


def run_cli(*args: str, data_dir: Path | None = None, database_url: str | None = None,
            env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    extra = {"MESHYARD_DATA_DIR": str(data_dir)} if data_dir else {}
    if database_url:
        extra["MESHYARD_DATABASE_URL"] = database_url
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**clean_env(**extra), **(env or {})}, cwd=REPO)


@dataclass
class Server:
    """One `meshyard serve --port 0` process; restartable on the same data dir."""

    data_dir: Path
    database_url: str | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # MESHYARD_* settings for this server
    proc: subprocess.Popen | None = None
    url: str = ""
    starts: int = 0
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"

    def start(self, timeout: float = 60) -> Server:
        self.starts += 1
        args = [*CLI, "serve", "--port", "0", "--data-dir", str(self.data_dir), "--no-scheduler",
                *self.extra_args]
        if self.database_url:
            args += ["--database-url", self.database_url]
        log = self.log_path.open("a")
        log.write(f"\n--- start {self.starts} ---\n")
        log.flush()
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     env=clean_env(**self.env), cwd=REPO)
        log.close()
        self.url = self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        server_file = self.data_dir / "server.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                info = json.loads(server_file.read_text())
                if info["pid"] == self.proc.pid and \
                        httpx.get(info["url"] + "/readyz", timeout=2).status_code == 200:
                    return str(info["url"])
            except (OSError, ValueError, KeyError, httpx.HTTPError):
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (uvicorn's graceful shutdown), SIGKILL only if that hangs."""
        if self.proc is None:
            return 0
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    @property
    def admin_token(self) -> str:
        return (self.data_dir / "admin.token").read_text().strip()

    def create_token(self, user: str, *, admin: bool = False, role: str | None = None) -> str:
        """Over the API with the admin token, as `meshyard token create` does (test_cli covers
        the command itself; a subprocess per token costs seconds here). The test process
        never opens the running server's database."""
        body = {"user": user, "label": "test", **({"role": "admin"} if admin else {}),
                **({"role": role} if role else {})}
        with self.client(self.admin_token) as http:
            r = http.post("/v1/tokens", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["token"])

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    from tests.postgres import postgres_base_url, postgres_source, scratch_postgres_database

    base = postgres_base_url()
    if not base:
        pytest.skip(postgres_source())

    with scratch_postgres_database(base, prefix="meshyard_api_") as url:
        yield url


@contextmanager
def database(kind: str) -> Iterator[str | None]:
    """None means the embedded default (SQLite in the data dir)."""
    if kind == "sqlite":
        yield None
    else:
        with fresh_postgres_database() as url:
            yield url


@dataclass(frozen=True)
class Users:
    admin: str
    alice: str
    bob: str


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Server]:
    with database(request.param) as url:
        srv = Server(data_dir=tmp_path_factory.mktemp(f"api-{request.param}") / "data",
                     database_url=url)
        srv.start()
        try:
            yield srv
        finally:
            srv.stop()


@pytest.fixture(scope="session")
def users(server: Server) -> Users:
    return Users(admin=server.admin_token, alice=server.create_token("alice"),
                 bob=server.create_token("bob"))
