"""Browser-test fixtures: a real `meshyard serve` subprocess on 127.0.0.1 (free port, tmp data
dir, scheduler off so the tests drive job states through the Store on the same SQLite file),
and Debian's chromium driven by Playwright — one browser per test module.

Screenshots go to $MESHYARD_TEST_ARTIFACTS (or a tmp dir); they are never committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.store.db import make_engine
from orchestrator.store.repo import Store

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
REPO = Path(__file__).resolve().parents[2]
WAIT_MS = 10_000

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@dataclass
class Server:
    url: str
    token: str
    data_dir: Path
    store: Store
    proc: subprocess.Popen[bytes]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10,
                            headers={"Authorization": f"Bearer {self.token}"})


def _meshyard() -> list[str]:
    exe = Path(sys.executable).with_name("meshyard")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "api.cli"]


def _wait_for_server(data_dir: Path, proc: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + 120
    info = data_dir / "server.json"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"meshyard serve exited ({proc.returncode}):\n{log.read_text()}")
        if info.exists():
            try:
                url = str(json.loads(info.read_text())["url"])
                if httpx.get(url + "/healthz", timeout=2).status_code < 500:
                    return url
            except (ValueError, KeyError, httpx.HTTPError):
                pass
        time.sleep(0.1)
    raise RuntimeError(f"meshyard serve did not start within 120 s:\n{log.read_text()}")


@contextlib.contextmanager
def run_server(data_dir: Path, *, scheduler: bool, extra_args: tuple[str, ...] = (),
               extra_env: dict[str, str] | None = None) -> Iterator[Server]:
    """`meshyard serve` on a free port of 127.0.0.1; stopped (SIGTERM, then SIGKILL) after.
    With the scheduler on, the server starts and stops its own local Ray."""
    token = "e2e-" + secrets.token_urlsafe(24)
    env = {**os.environ, "MESHYARD_ADMIN_TOKEN": token, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           **(extra_env or {})}
    env.pop("RAY_ADDRESS", None)
    log = data_dir / "serve.log"
    args = ["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir),
            "--no-access-log", *(() if scheduler else ("--no-scheduler",)), *extra_args]
    with log.open("wb") as out:
        proc = subprocess.Popen([*_meshyard(), *args], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        url = _wait_for_server(data_dir, proc, log)
        store = Store(make_engine(f"sqlite:///{(data_dir / 'meshyard.db').resolve()}"))
        try:
            yield Server(url=url, token=token, data_dir=data_dir, store=store, proc=proc)
        finally:
            store.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tmp_path_factory.mktemp("meshyard-e2e"), scheduler=False) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium "
                    "(apt-get install chromium; .ci/run does this)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get("MESHYARD_TEST_ARTIFACTS")
    path = Path(configured) if configured else tmp_path_factory.mktemp("e2e-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def context(browser: Any, server: Server) -> Iterator[Any]:
    ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    ctx.set_default_timeout(WAIT_MS)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: Any, server: Server) -> Any:
    """A signed-in page whose console errors and dialogs are recorded."""
    p = context.new_page()
    p.dialogs = []  # type: ignore[attr-defined]
    p.errors = []  # type: ignore[attr-defined]
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    # CSP violations and failed loads show up as console errors, not page errors.
    p.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
    p.goto("/login")
    p.fill("#token", server.token)
    p.click("#login-submit")
    p.wait_for_url(server.url + "/")
    return p


def shoot(page: Any, artifacts: Path, name: str) -> None:
    """Desktop and phone screenshots of the current page; at both sizes nothing may stick out
    sideways (wide tables scroll inside their own box, the page itself never does)."""
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        page.wait_for_timeout(200)  # let the layout settle after the resize
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= size["width"], f"{name}: page is {wide}px wide at {size['width']}px"
        page.screenshot(path=str(artifacts / f"{name}-{size['width']}x{size['height']}.png"),
                        full_page=True)
    page.set_viewport_size(DESKTOP)
