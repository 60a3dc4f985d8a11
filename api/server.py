"""Running the service: migrate, ensure an admin, serve with uvicorn, optionally submit a demo.

`meshyard serve` is a thin wrapper over :func:`serve`. The listening socket is bound before
uvicorn starts so `--port 0` works: the chosen URL goes to `<data dir>/server.json`, which the
CLI and the tests read to find the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from sqlalchemy.engine import make_url

from api.access_log import redact_access_log
from api.app import create_app
from api.client import ADMIN_TOKEN_FILE, SERVER_FILE, MeshyardAPIError, MeshyardClient
from api.process_secrets import hide_secrets
from api.state import RuntimeHooks
from orchestrator.isolation.modes import TRUSTED_WARNING, IsolationMode
from orchestrator.settings import Settings
from orchestrator.store.db import make_engine, upgrade_database
from orchestrator.store.repo import Store

log = logging.getLogger("meshyard.server")
DEMO_SUBMISSION_ID = "demo-quickstart"
DEMO_POOL_WAIT_S = 60.0
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Prepared:
    store: Store
    admin_token: str | None  # a token this process may use for the demo submission
    created_admin_token: str | None  # printed once when this start created the admin


def write_private(path: Path, text: str) -> None:
    """Writes a secret readable by the owner only (0600), also when the file existed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    path.chmod(0o600)


def _sqlite_files(url: str) -> list[Path]:
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or u.database in (None, "", ":memory:"):
        return []
    db = Path(str(u.database))
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def tighten_private_files(settings: Settings) -> None:
    """The data dir 0700; the SQLite database (with its WAL and shared-memory files) and
    admin.token 0600 — on every start, so a mode loosened by hand or by a copy is fixed."""
    for path, mode in [(settings.data_dir, 0o700),
                       *((p, 0o600) for p in _sqlite_files(settings.resolved_database_url)),
                       (settings.data_dir / ADMIN_TOKEN_FILE, 0o600)]:
        try:
            path.chmod(mode)
        except FileNotFoundError:
            continue
        except PermissionError:  # a mount point owned by root (a Kubernetes emptyDir)
            log.warning("cannot make %s private (mode %o): not its owner", path, mode)


def prepare(settings: Settings) -> Prepared:
    """Creates the data dir (and its datasets/, the default data root), applies migrations,
    makes sure an admin exists and keeps the private files private."""
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.datasets_dir.mkdir(exist_ok=True)
    url = settings.resolved_database_url
    upgrade_database(url)
    store = Store(make_engine(url))
    created = store.ensure_admin(settings.admin_token)
    token_file = settings.data_dir / ADMIN_TOKEN_FILE
    if created and not settings.admin_token:
        write_private(token_file, created + "\n")
    tighten_private_files(settings)
    known = settings.admin_token or created or _read(token_file)
    return Prepared(store=store, admin_token=known,
                    created_admin_token=created if not settings.admin_token else None)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def build_runtime(settings: Settings, store: Store, *, api_port: int | None = None
                  ) -> RuntimeHooks | None:
    """The scheduler / controller runtime (`orchestrator.runtime.service`); None with
    `--no-scheduler`, where the API runs alone and jobs stay QUEUED. Imported here, not at the
    top, so the CLI's other commands start without loading Ray. `api_port`: where the API
    listens (jobs are kept out of it)."""
    if not settings.scheduler_enabled:
        return None
    from orchestrator.runtime.service import build_runtime as build

    return build(settings=settings, store=store, api_port=api_port)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def public_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def _submit_demo(server: uvicorn.Server, *, url: str, token: str, runtime: Any = None) -> None:
    spec = next((p for p in (Path("examples/quickstart.yaml"),
                             REPO_ROOT / "examples" / "quickstart.yaml") if p.exists()), None)
    if spec is None:
        log.warning("--demo: examples/quickstart.yaml not found; nothing submitted")
        return
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.should_exit:
        return
    if runtime is not None and getattr(runtime, "warm_pool", 0) > 0:
        # The demo job starts on the warm pool, as a user's job on a running service does.
        try:
            runtime.wait_for_pool(timeout_s=DEMO_POOL_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the demo is submitted either way
            log.info("--demo: submitting without a full warm pool (%s)", exc)
    try:
        with MeshyardClient(url, token) as client:
            job = client.submit(spec, submission_id=DEMO_SUBMISSION_ID)
    except (MeshyardAPIError, OSError) as exc:
        log.error("--demo submission failed: %s", exc)
        return
    print(f"demo job {job.id} ({job.name}) is {job.state.value}: {url}/v1/jobs/{job.id}",
          flush=True)


def serve(settings: Settings, *, demo: bool = False, access_log: bool = True) -> None:
    if not settings.ray_address:
        # Embedded default: the local Ray (and so gloo's rendezvous) on loopback. Ray reads
        # this once, when it is first imported, and runtime modules import it; set it first.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Before Ray starts (it copies this process's command line into its job table): the
    # database URL and a seeded admin token leave /proc/<pid>/environ and cmdline.
    log.info("secrets: %s", hide_secrets(values=(settings.admin_token, settings.database_url)))
    prepared = prepare(settings)
    if prepared.created_admin_token:
        print("Created the admin user. Its token is shown once and saved to "
              f"{settings.data_dir / ADMIN_TOKEN_FILE} (mode 0600):\n"
              f"  {prepared.created_admin_token}", flush=True)
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        raise SystemExit(f"meshyard: cannot listen on {settings.host}:{settings.port}: "
                         f"{exc.strerror}; pick another --port (0 picks a free one)") from None
    port = sock.getsockname()[1]
    url = public_url(settings.host, port)
    runtime = build_runtime(settings=settings, store=prepared.store, api_port=port)
    app = create_app(settings, store=prepared.store, runtime=runtime)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", access_log=access_log,
                                           timeout_graceful_shutdown=10,
                                           proxy_headers=False))  # the app applies them
    redact_access_log()  # after uvicorn's Config set its logging up
    server_file = settings.data_dir / SERVER_FILE
    write_private(server_file, json.dumps({"url": url, "pid": os.getpid(), "port": port}) + "\n")
    if demo:
        # No token at hand (admin made earlier, token file deleted): mint one for the demo.
        token = prepared.admin_token or prepared.store.create_token("admin", admin=True,
                                                                    label="demo")
        threading.Thread(target=_submit_demo, args=(server,), daemon=True,
                         kwargs={"url": url, "token": token, "runtime": runtime}).start()
    print(f"meshyard serving on {url} (data dir {settings.data_dir})", flush=True)
    if settings.isolation is IsolationMode.TRUSTED:
        print(f"WARNING: {TRUSTED_WARNING}", flush=True)
    else:
        print("isolation: isolated (every rank of user code confined to its own job; "
              "GET /v1/cluster says whether this host enforces it)", flush=True)
    token_file = settings.data_dir / ADMIN_TOKEN_FILE
    if token_file.exists():
        print(f"dashboard: {url}/  (log in with the token in {token_file})", flush=True)
    try:
        with _exit_quietly_on_signals():
            server.run(sockets=[sock])
    finally:
        _remove_server_file(server_file)
        prepared.store.engine.dispose()


class _Stopped(Exception):
    pass


@contextlib.contextmanager
def _exit_quietly_on_signals() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal against the
    handlers it found. Installing these first turns that into a normal return (exit 0, the
    server file removed) instead of death by signal or a KeyboardInterrupt traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(_sig: int, _frame: FrameType | None) -> None:
        raise _Stopped

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _remove_server_file(path: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        info: dict[str, Any] = json.loads(path.read_text())
        if info.get("pid") == os.getpid():
            path.unlink()
