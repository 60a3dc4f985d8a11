"""Dashboard sessions, TLS behind a proxy, the docs page and the Host check.

By hand, before: the dashboard cookie was the API token itself (so a copied cookie was a
token, and logout could not end it), it never expired server-side, /docs loaded scripts with
no CSP, and any Host header was answered (a DNS-rebinding page could read the API).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.dashboard.session import COOKIE_NAME, csrf_token
from api.server import prepare
from orchestrator.settings import Settings
from tests.integration.api.conftest import Server, Users

FORM = {"content-type": "application/x-www-form-urlencoded"}


def _login(url: str, token: str, **headers: str) -> httpx.Response:
    return httpx.post(url + "/login", content=f"token={token}", headers={**FORM, **headers},
                      follow_redirects=False, timeout=10)


def _signed_in(url: str, secret: str) -> bool:
    r = httpx.get(url + "/", cookies={COOKIE_NAME: secret}, follow_redirects=False, timeout=10)
    return r.status_code == 200


def test_the_cookie_is_a_session_that_logout_ends(server: Server, users: Users) -> None:
    r = _login(server.url, users.alice)
    assert r.status_code == 303
    secret = r.cookies[COOKIE_NAME]
    assert secret.startswith("mss_") and users.alice not in r.headers["set-cookie"]
    assert _signed_in(server.url, secret)
    api = httpx.get(server.url + "/v1/jobs", cookies={COOKIE_NAME: secret}, timeout=10)
    assert api.status_code == 200  # the dashboard's own fetches
    # The cookie's value is no API token.
    bearer = httpx.get(server.url + "/v1/jobs", timeout=10,
                       headers={"Authorization": f"Bearer {secret}"})
    assert bearer.status_code == 401
    out = httpx.post(server.url + "/logout", content=f"csrf_token={csrf_token(secret)}",
                     headers=FORM, cookies={COOKIE_NAME: secret}, follow_redirects=False,
                     timeout=10)
    assert out.status_code == 303
    # A copy of the cookie kept from before logout is dead, on pages and on the API.
    assert not _signed_in(server.url, secret)
    assert httpx.get(server.url + "/v1/jobs", cookies={COOKIE_NAME: secret},
                     timeout=10).status_code == 401


def test_revoking_the_token_ends_its_sessions(server: Server, users: Users) -> None:
    with server.client(users.admin) as admin:
        made = admin.post("/v1/tokens", json={"user": "bob", "label": "browser"}).json()
    secret = _login(server.url, made["token"]).cookies[COOKIE_NAME]
    assert _signed_in(server.url, secret)
    with server.client(users.admin) as admin:
        assert admin.delete(f"/v1/tokens/{made['id']}").status_code == 200
    assert not _signed_in(server.url, secret)


def test_cookie_is_secure_behind_a_trusted_tls_proxy(server: Server, users: Users) -> None:
    # The server trusts 127.0.0.1 as a proxy by default (MESHYARD_TRUSTED_PROXIES).
    plain = _login(server.url, users.alice)
    assert "secure" not in plain.headers["set-cookie"].lower()
    proxied = _login(server.url, users.alice, **{"x-forwarded-proto": "https"})
    assert proxied.status_code == 303
    assert "secure" in proxied.headers["set-cookie"].lower()


@pytest.fixture
def app_env(tmp_path: Path, request: pytest.FixtureRequest
            ) -> Iterator[tuple[TestClient, str]]:
    settings = Settings(data_dir=tmp_path / "data", **getattr(request, "param", {}))
    prepared = prepare(settings)
    assert prepared.admin_token is not None
    with TestClient(create_app(settings, store=prepared.store),
                    base_url="http://127.0.0.1") as client:
        yield client, prepared.admin_token
    prepared.store.close()


@pytest.mark.parametrize("app_env", [{"session_ttl_s": 1.0}], indirect=True)
def test_sessions_expire(app_env) -> None:
    """The server serves a session's pages until its TTL has passed and not after. The
    cookie goes with every request as it was set (a client's jar keeps Max-Age in whole
    seconds from the last whole second, so it may drop the cookie before the server's TTL;
    this reads the server). Both sides are read against the clock: on a loaded machine more
    than the TTL can pass between the login and the next request, and that try says
    nothing either way."""
    client, token = app_env
    for _ in range(5):
        before = time.monotonic()
        login = client.post("/login", content=f"token={token}", headers=FORM,
                            follow_redirects=False)
        assert login.status_code == 303, login.text
        assert "max-age=1;" in login.headers["set-cookie"].lower()
        sent = {"cookie": f"{COOKIE_NAME}={login.cookies[COOKIE_NAME]}"}
        client.cookies.clear()
        first = client.get("/", headers=sent, follow_redirects=False)
        if first.status_code == 200:
            break
        # refused: only right if the whole TTL had passed since the login was sent
        assert time.monotonic() - before >= 1.0, "a fresh session was refused"
    else:
        pytest.fail("five logins in a row took longer than the 1 s TTL to be read back")
    deadline = time.monotonic() + 10
    while (page := client.get("/", headers=sent, follow_redirects=False)).status_code == 200:
        assert time.monotonic() < deadline, "the session never expired"
        time.sleep(0.05)
    assert time.monotonic() - before >= 1.0, "the session expired before its TTL"
    assert page.status_code == 303 and page.headers["location"] == "/login"


@pytest.mark.parametrize("app_env", [{"session_ttl_s": 0.5}], indirect=True)
def test_a_ttl_under_a_second_is_a_cookie_of_one_second(app_env) -> None:
    """Max-Age=0 would tell the browser to drop the cookie at once."""
    client, token = app_env
    login = client.post("/login", content=f"token={token}", headers=FORM,
                        follow_redirects=False)
    assert "max-age=1;" in login.headers["set-cookie"].lower()


@pytest.mark.parametrize("app_env", [{"trusted_proxies": ["10.9.9.9"]}], indirect=True)
def test_forwarded_proto_from_an_untrusted_client_is_ignored(app_env) -> None:
    client, token = app_env
    r = client.post("/login", content=f"token={token}", follow_redirects=False,
                    headers={**FORM, "x-forwarded-proto": "https"})
    assert r.status_code == 303 and "secure" not in r.headers["set-cookie"].lower()


def test_docs_are_off_by_default(server: Server) -> None:
    assert httpx.get(server.url + "/docs", timeout=10).status_code == 404
    assert httpx.get(server.url + "/redoc", timeout=10).status_code == 404
    assert httpx.get(server.url + "/openapi.json", timeout=10).status_code == 200


@pytest.mark.parametrize("app_env", [{"api_docs": True}], indirect=True)
def test_docs_when_enabled_carry_a_csp_naming_their_scripts(app_env) -> None:
    client, _ = app_env
    r = client.get("/docs")
    assert r.status_code == 200 and "swagger-ui" in r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "'sha256-" in csp
    script_src = next(p for p in csp.split(";") if p.strip().startswith("script-src"))
    assert "unsafe-inline" not in script_src and "frame-ancestors 'none'" in csp


def test_unknown_host_headers_are_refused(server: Server, users: Users) -> None:
    port = server.url.rsplit(":", 1)[1]
    auth = {"Authorization": f"Bearer {users.alice}"}
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        for path in ("/v1/jobs", "/login", "/"):
            r = httpx.get(server.url + path, headers={**auth, "host": host}, timeout=10)
            assert r.status_code == 400, (host, path, r.status_code)
            assert r.json()["setting"] == "MESHYARD_ALLOWED_HOSTS"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert httpx.get(server.url + "/v1/jobs", headers={**auth, "host": host},
                         timeout=10).status_code == 200, host
    # Probes answer whatever the Host (kubelet sends the pod IP).
    assert httpx.get(server.url + "/healthz", headers={"host": "10.1.2.3:8470"},
                     timeout=10).status_code == 200


@pytest.mark.parametrize("app_env", [{"allowed_hosts": ["meshyard.example.com"]}],
                         indirect=True)
def test_allowed_hosts_setting_adds_names(app_env) -> None:
    client, token = app_env
    auth = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/jobs", headers={**auth, "host": "meshyard.example.com"}
                      ).status_code == 200
    assert client.get("/v1/jobs", headers={**auth, "host": "other.example.com"}
                      ).status_code == 400
