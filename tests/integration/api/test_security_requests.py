"""The request side of tenant isolation, in-process on a real SQLite store: failed logins are
throttled per client address, /metrics shows anonymous scrapers no tenant data, revoking a
token ends its dashboard sessions on the next request, a token in a query string stays out
of the access log (on a real server), and `entrypoint.env` values are echoed to admins
only."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.dashboard.session import COOKIE_NAME
from api.server import prepare
from orchestrator.admission.access import Role
from orchestrator.lifecycle import JobState, Reason
from orchestrator.settings import Settings
from orchestrator.store.repo import Store
from tests.integration.api.conftest import Server

FORM = {"content-type": "application/x-www-form-urlencoded"}


@dataclass
class Env:
    client: TestClient
    store: Store
    tokens: dict[str, str]

    def auth(self, who: str, **headers: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}", **headers}


@pytest.fixture
def env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Env]:
    settings = Settings(data_dir=tmp_path / "data", login_failures_max=3,
                        **getattr(request, "param", {}))
    prepared = prepare(settings)
    store = prepared.store
    assert prepared.admin_token is not None
    tokens = {"admin": prepared.admin_token, "alice": store.create_token("alice"),
              "bob": store.create_token("bob"), "vic": store.create_token("vic")}
    store.set_role("vic", Role.VIEWER)
    # The client is the trusted proxy (127.0.0.1): X-Forwarded-For names each caller.
    with TestClient(create_app(settings, store=store), base_url="http://127.0.0.1",
                    client=("127.0.0.1", 40000)) as client:
        yield Env(client, store, tokens)
    store.close()


def _from(address: str) -> dict[str, str]:
    return {"x-forwarded-for": address}


def _login(env: Env, token: str, address: str) -> Any:
    return env.client.post("/login", content=f"token={token}", follow_redirects=False,
                           headers={**FORM, **_from(address)})


def test_failed_logins_are_throttled_per_client_address(env: Env) -> None:
    attacker, other = "203.0.113.7", "198.51.100.2"
    bad = {"Authorization": "Bearer msy_guess"}
    for _ in range(2):
        assert env.client.get("/v1/jobs", headers={**bad, **_from(attacker)}).status_code == 401
    assert _login(env, "msy_guess", attacker).status_code == 401  # the form counts too
    # Over the limit: even a valid token from there waits (it could be the lucky guess).
    r = env.client.get("/v1/jobs", headers=env.auth("alice", **_from(attacker)))
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60
    body = r.json()
    assert body["type"] == "urn:meshyard:problem:login-throttled"
    assert body["setting"] == "MESHYARD_LOGIN_FAILURES_MAX"
    form = _login(env, env.tokens["alice"], attacker)
    assert form.status_code == 429 and int(form.headers["retry-after"]) >= 1
    assert COOKIE_NAME not in form.cookies
    # Another address is not throttled by those failures, and counts its own.
    assert env.client.get("/v1/jobs", headers=env.auth("bob", **_from(other))).status_code \
        == 200
    assert _login(env, env.tokens["bob"], other).status_code == 303
    assert env.client.get("/v1/jobs", headers={**bad, **_from(other)}).status_code == 401


def test_revoking_a_token_ends_its_sessions_on_the_very_next_request(env: Env) -> None:
    def session(token: str) -> dict[str, str]:
        secret = _login(env, token, "192.0.2.10").cookies[COOKIE_NAME]
        return {"Cookie": f"{COOKIE_NAME}={secret}", **_from("192.0.2.10")}

    [first] = env.client.get("/v1/tokens", headers=env.auth("alice")).json()["items"]
    cookie, twin = session(env.tokens["alice"]), session(env.tokens["alice"])
    spare = session(env.store.create_token("alice"))  # opened with another of her tokens
    for c in (cookie, twin, spare):
        assert env.client.get("/v1/jobs", headers=c).status_code == 200  # now cached
    assert env.client.delete(f"/v1/tokens/{first['id']}",
                             headers=env.auth("admin")).status_code == 200
    for c in (cookie, twin):
        assert env.client.get("/v1/jobs", headers=c).status_code == 401
        assert env.client.get("/", headers=c, follow_redirects=False).headers["location"] == \
            "/login"
        assert env.store.session_user(c["Cookie"].split("=", 1)[1]) is None  # deleted
    assert env.client.get("/v1/jobs", headers=spare).status_code == 200
    # The offline revoke (`meshyard token revoke --database-url`) deletes the sessions too.
    assert env.store.revoke_tokens("alice") == 1
    assert env.store.session_user(spare["Cookie"].split("=", 1)[1]) is None


def _hung_job(env: Env, owner: str, name: str) -> str:
    job = env.client.post("/v1/jobs", headers=env.auth(owner), json={"name": name}).json()
    for dst in (JobState.PLACING, JobState.STARTING, JobState.RUNNING):
        env.store.transition(job["id"], dst, reason=Reason.PLACEMENT_FOUND)
    env.store.set_condition(job["id"], {"kind": "hung", "verdict": "NOT_JOINED",
                                        "culprit_ranks": [1], "since_s": 1.0,
                                        "headline": f"{name}: rank 1 never entered"})
    return str(job["id"])


def _tenant_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith("#") and "job_id=" in ln]


def test_metrics_show_tenant_series_only_to_tokens_that_may_read_them(env: Env) -> None:
    ann, bobs = _hung_job(env, "alice", "alice-secret-run"), _hung_job(env, "bob", "bob-run")
    anon = env.client.get("/metrics")
    assert anon.status_code == 200
    assert 'meshyard_jobs{state="RUNNING"} 2.0' in anon.text  # cluster-level counts stay
    assert "meshyard_http_requests_total" in anon.text
    for secret in (ann, bobs, "alice-secret-run", "bob-run", "alice", 'culprit_ranks="1"'):
        assert secret not in anon.text
    assert _tenant_lines(anon.text) == []

    def seen(who: str) -> set[str]:
        text = env.client.get("/metrics", headers=env.auth(who)).text
        return {ln.split('job_id="')[1].split('"')[0] for ln in _tenant_lines(text)}

    assert seen("alice") == {ann} and seen("bob") == {bobs}
    assert seen("vic") == seen("admin") == {ann, bobs}  # viewers and admins read every job
    assert env.client.get("/metrics", headers={"Authorization": "Bearer msy_bad"}
                          ).status_code == 401
    # The dashboard's cookie is no scraper credential: the anonymous view.
    secret = _login(env, env.tokens["alice"], "192.0.2.20").cookies[COOKIE_NAME]
    cookie = env.client.get("/metrics", headers={"Cookie": f"{COOKIE_NAME}={secret}"})
    assert _tenant_lines(cookie.text) == []


@pytest.mark.parametrize("env", [{"metrics_anonymous": "off"}], indirect=True)
def test_metrics_can_require_a_token(env: Env) -> None:
    r = env.client.get("/metrics")
    assert r.status_code == 401 and "MESHYARD_METRICS_ANONYMOUS" in r.json()["detail"]
    assert env.client.get("/metrics", headers=env.auth("vic")).status_code == 200


def test_a_token_in_a_query_string_never_reaches_the_access_log(server: Server) -> None:
    """On a real `meshyard serve`: uvicorn's own access log line, read from its output."""
    marker = f"probe-{time.monotonic_ns()}"
    leaked = f"msy_leak{time.monotonic_ns()}"
    with server.client(None) as anon:
        assert anon.get("/v1/jobs", params={"token": leaked, "limit": "5",
                                            "q": marker}).status_code == 401
    deadline = time.monotonic() + 10
    while marker not in (log := server.log_path.read_text()):
        assert time.monotonic() < deadline, "no access log line for the request"
        time.sleep(0.1)
    [line] = [ln for ln in log.splitlines() if marker in ln]
    assert f'"GET /v1/jobs?token=***&limit=5&q={marker} HTTP/1.1" 401' in line, line
    assert leaked not in log


SECRET = "wandb-key-9f8e7d6c5b4a"


def test_entrypoint_env_values_are_shown_to_admins_only(env: Env) -> None:
    spec = {"name": "with-secret", "entrypoint": {"command": ["python", "t.py"], "env": {
        "WANDB_API_KEY": SECRET, "MODE": "fast"}}}
    made = env.client.post("/v1/jobs", headers=env.auth("alice"), json=spec)
    assert made.status_code == 201, made.text
    job_id = made.json()["id"]
    redacted = {"WANDB_API_KEY": "***", "MODE": "***"}
    assert made.json()["spec"]["entrypoint"]["env"] == redacted  # not even to its owner
    again = env.client.post("/v1/jobs", headers=env.auth("alice"),
                            json={"spec": spec, "submission_id": "s1"})
    assert again.json()["spec"]["entrypoint"]["env"] == redacted
    for who, env_shown in (("alice", redacted), ("vic", redacted),
                           ("admin", spec["entrypoint"]["env"])):
        got = env.client.get(f"/v1/jobs/{job_id}", headers=env.auth(who))
        assert got.json()["spec"]["entrypoint"]["env"] == env_shown, who
        cookie = _login(env, env.tokens[who], "192.0.2.30").cookies[COOKIE_NAME]
        page = env.client.get(f"/jobs/{job_id}", headers={"Cookie": f"{COOKIE_NAME}={cookie}"})
        assert page.status_code == 200 and "WANDB_API_KEY" in page.text
        assert (SECRET in page.text) is (who == "admin"), who
    cancelled = env.client.post(f"/v1/jobs/{job_id}/cancel", headers=env.auth("alice"))
    assert cancelled.json()["spec"]["entrypoint"]["env"] == redacted
    stored = env.store.get_job(job_id)
    assert stored is not None and stored.spec.entrypoint is not None
    assert stored.spec.entrypoint.env["WANDB_API_KEY"] == SECRET
