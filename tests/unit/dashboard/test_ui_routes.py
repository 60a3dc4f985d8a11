"""Dashboard routes over HTTP (FastAPI TestClient) on a real SQLite store: login cookie,
CSRF, security headers, escaping, static files, artifact downloads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.dashboard.session import COOKIE_NAME, csrf_token
from orchestrator.lifecycle import JobState
from orchestrator.mesh import MeshShape
from orchestrator.settings import Settings
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store
from tests.unit.dashboard.conftest import TOKEN
from tests.unit.dashboard.seed import XSS_NAME, hang_report, seed_everything

FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture
def jobs(store: Store) -> dict[str, JobRecord]:
    return seed_everything(store)


@pytest.fixture
def client(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path, database_url=str(store.engine.url)),
                     store=store)
    with TestClient(app, base_url="http://127.0.0.1:8470") as c:
        yield c


def login(client: TestClient, token: str = TOKEN) -> None:
    r = client.post("/login", content=f"token={token}", headers=FORM, follow_redirects=False)
    assert r.status_code == 303, r.text


def session_csrf(client: TestClient) -> str:
    """The CSRF token of the client's current session (an HMAC of the cookie's secret)."""
    return csrf_token(client.cookies[COOKIE_NAME])


def test_pages_redirect_to_login_without_a_session(client: TestClient) -> None:
    for path in ("/", "/cluster", "/jobs/job-x"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/login"


def test_login_sets_httponly_strict_cookie_and_no_token_in_redirect(client: TestClient) -> None:
    r = client.post("/login", content=f"token={TOKEN}", headers=FORM, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    # The cookie holds a server-side session's secret, never the API token itself.
    assert f"{COOKIE_NAME}=mss_" in cookie and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert TOKEN not in r.headers["location"]


def test_wrong_token_is_refused_without_a_cookie(client: TestClient) -> None:
    r = client.post("/login", content="token=nope", headers=FORM, follow_redirects=False)
    assert r.status_code == 401
    assert "set-cookie" not in r.headers
    assert "not valid" in r.text


def test_cross_site_login_post_is_refused(client: TestClient) -> None:
    r = client.post("/login", content=f"token={TOKEN}", follow_redirects=False,
                    headers={**FORM, "origin": "https://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


def test_token_in_query_string_is_ignored(client: TestClient) -> None:
    r = client.get(f"/login?token={TOKEN}", follow_redirects=False)
    assert r.status_code == 200 and "set-cookie" not in r.headers


def test_every_page_has_csp_and_no_inline_script(client: TestClient,
                                                 jobs: dict[str, JobRecord]) -> None:
    login(client)
    for path in ("/login", "/", "/cluster", "/submit",
                 *(f"/jobs/{j.id}" for j in jobs.values())):
        r = client.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        for tag in re.findall(r"<script[^>]*>", r.text):
            assert 'src="/static/' in tag, (path, tag)  # no inline scripts anywhere
        assert not re.search(r"<script[^>]*>\s*[^<\s]", r.text), path
        assert " on" + "load=" not in r.text and "style=" not in r.text


def test_job_name_with_markup_is_escaped(client: TestClient, jobs: dict[str, JobRecord]) -> None:
    login(client)
    r = client.get(f"/jobs/{jobs['xss'].id}")
    assert XSS_NAME not in r.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in r.text


def test_cookie_api_call_needs_the_csrf_header(client: TestClient, store: Store,
                                               jobs: dict[str, JobRecord]) -> None:
    login(client)
    job_id = jobs["queued"].id
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200  # reads need no CSRF token
    r = client.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status_code == 403 and "CSRF" in r.json()["detail"]
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers={"x-csrf-token": "0" * 64})
    assert r.status_code == 403
    r = client.post(f"/v1/jobs/{job_id}/cancel",
                    headers={"x-csrf-token": session_csrf(client), "origin": "https://evil.example"})
    assert r.status_code == 403
    assert store.get_job(job_id).state == JobState.QUEUED  # type: ignore[union-attr]
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers={"x-csrf-token": session_csrf(client),
                                                          "origin": "http://127.0.0.1:8470"})
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"


def test_page_carries_the_csrf_token_of_its_session(client: TestClient) -> None:
    login(client)
    r = client.get("/")
    assert f'<meta name="csrf-token" content="{session_csrf(client)}">' in r.text


def test_bearer_clients_need_no_csrf_token(client: TestClient, jobs: dict[str, JobRecord]) -> None:
    r = client.post(f"/v1/jobs/{jobs['queued'].id}/cancel",
                    headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200


def test_logout_needs_the_form_csrf_token_and_clears_the_cookie(client: TestClient) -> None:
    login(client)
    r = client.post("/logout", content="csrf_token=wrong", headers=FORM, follow_redirects=False)
    assert r.status_code == 403
    r = client.post("/logout", content=f"csrf_token={session_csrf(client)}", headers=FORM,
                    follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert f'{COOKIE_NAME}=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers[
        "set-cookie"]


def test_other_users_jobs_are_not_found(client: TestClient, store: Store,
                                        jobs: dict[str, JobRecord]) -> None:
    login(client, store.create_token("bob"))
    r = client.get(f"/jobs/{jobs['running'].id}")
    assert r.status_code == 404 and jobs["running"].name not in r.text


def test_static_files_and_traversal(client: TestClient) -> None:
    r = client.get("/static/job.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/..%2Fsession.py").status_code == 404
    assert client.get("/static/nope.js").status_code == 404


def test_no_script_uses_innerhtml() -> None:
    static = Path(__file__).resolve().parents[3] / "api" / "dashboard" / "static"
    for js in static.glob("*.js"):
        text = js.read_text()
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text, js.name
        assert "document.write" not in text and "eval(" not in text, js.name


def test_artifact_download_serves_only_listed_files_under_the_data_dir(
        client: TestClient, store: Store, jobs: dict[str, JobRecord], tmp_path: Path) -> None:
    login(client)
    job = jobs["running"]
    inside = tmp_path / "runs" / job.id / "stacks.txt"
    inside.parent.mkdir(parents=True)
    inside.write_text("stack of rank 3\n")
    outside = tmp_path.parent / "secret.txt"
    outside.write_text("nope\n")
    report = hang_report(world=16, culprit=3, mesh=MeshShape(tp=4, pp=2, dp_replicate=2),
                         nodes=["dgx-a1", "dgx-a2"], artifacts=[str(inside), str(outside)])
    d = store.add_diagnosis(job.id, 1, verdict="NOT_JOINED", culprit_ranks=[3],
                            summary=report.summary, report=report.to_dict())
    r = client.get(f"/jobs/{job.id}/artifacts/{d.id}/0")
    assert r.status_code == 200 and r.text == "stack of rank 3\n"
    assert "attachment" in r.headers["content-disposition"]
    assert client.get(f"/jobs/{job.id}/artifacts/{d.id}/1").status_code == 404
    assert client.get(f"/jobs/{job.id}/artifacts/{d.id}/2").status_code == 404
    assert client.get(f"/jobs/{jobs['queued'].id}/artifacts/{d.id}/0").status_code == 404


def test_job_page_shows_spec_and_levels(client: TestClient,
                                        jobs: dict[str, JobRecord]) -> None:
    login(client)
    r = client.get(f"/jobs/{jobs['running'].id}")
    assert "name: tp4-pp2-dp2" in r.text and "pp_microbatches: 2" in r.text
    assert 'data-levels="leaf,spine"' in r.text


def test_comm_signature_json_estimates_on_the_placement(client: TestClient, store: Store,
                                                        jobs: dict[str, JobRecord]) -> None:
    login(client)
    r = client.get(f"/jobs/{jobs['running'].id}/comm.json")
    assert r.status_code == 200 and r.headers["content-security-policy"]
    body = r.json()
    assert body["available"] is True
    assert [row["dimension"] for row in body["rows"]] == ["tp", "dp_replicate", "pp"]
    links = {row["dimension"]: row["bottleneck"] for row in body["rows"]}
    assert links["tp"].startswith("NV18") and links["pp"].startswith("IB@leaf")
    assert "Estimated per step" in body["note"]
    queued = client.get(f"/jobs/{jobs['queued'].id}/comm.json").json()
    assert all(row["est_time"] == "" for row in queued["rows"])
    login(client, store.create_token("dave"))
    assert client.get(f"/jobs/{jobs['running'].id}/comm.json").status_code == 404


def test_cluster_page_shows_usage_tree_and_hides_other_users_jobs(
        client: TestClient, store: Store, jobs: dict[str, JobRecord]) -> None:
    login(client)
    r = client.get("/cluster")
    assert "16 of 64 GPUs in use on 8 live nodes" in r.text
    assert jobs["running"].name in r.text and "leaf-b" in r.text
    login(client, store.create_token("carol"))
    r = client.get("/cluster")
    assert jobs["running"].name not in r.text and "another user&#39;s job" in r.text
