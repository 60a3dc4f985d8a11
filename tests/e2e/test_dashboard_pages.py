"""Dashboard pages in real headless Chromium against a real `meshyard serve`: submitting a job
(paste or upload, refusals inline with field paths, CSRF), the live cluster page, what a
finished job's page stops doing, the jobs list on a phone, axe-core's accessibility checks on
every page, and artifact links with a bearer token.

Job states are driven through the Store on the server's SQLite file (the scheduler is off).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.admission.access import Role
from orchestrator.lifecycle import JobState
from orchestrator.mesh import MeshShape
from tests.e2e.axe import axe_violations, describe
from tests.e2e.conftest import DESKTOP, PHONE, Server, shoot
from tests.unit.dashboard.seed import (
    add_node_usage,
    add_training,
    add_usage,
    hang_report,
    open_condition,
    place,
    seed_cluster,
    spec_doc,
    submit,
    walk,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration]
S = JobState


@pytest.fixture(scope="module")
def nodes(server: Server) -> list[str]:
    return seed_cluster(server.store)


def bearer(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"},
                        timeout=10)


def test_submit_shows_refusals_with_field_paths_then_submits(page: Any, server: Server,
                                                             tmp_path: Path) -> None:
    page.goto("/submit")
    text = page.locator("#spec-text")
    assert "name:" in text.input_value()  # the quickstart example to start from
    bad = {"name": "bad", "training": {"steps": 0}, "resources": {"cpus_per_worker": -1}}
    text.fill(json.dumps(bad))
    page.check("#spec-json")
    page.click("#submit-btn")
    errors = page.locator("#submit-error-list li")
    errors.first.wait_for()
    locs = {errors.nth(i).get_attribute("data-loc") for i in range(errors.count())}
    assert locs == {"training.steps", "resources.cpus_per_worker"}, locs
    text.fill("name: bad\nparallelism: {tp: 3}\nmodel: {n_heads: 8}\n")
    page.uncheck("#spec-json")
    page.click("#submit-btn")
    tp = page.locator('#submit-error-list li[data-loc="parallelism.tp"]')
    tp.first.wait_for()
    assert "tp=3 does not divide model.n_heads=8" in tp.first.inner_text()
    assert {errors.nth(i).get_attribute("data-loc") for i in range(errors.count())} == \
        {"parallelism.tp"}
    assert page.url.endswith("/submit")
    # The refusals are answers the page shows; the browser logs them as failed loads.
    assert page.errors and all("status of 422" in e for e in page.errors), page.errors
    page.errors.clear()

    spec = tmp_path / "tiny.yaml"
    spec.write_text("name: from-the-browser\nparallelism: {dp_replicate: 2}\n"
                    "training: {steps: 5}\n")
    page.set_input_files("#spec-file", str(spec))
    page.wait_for_function("() => document.getElementById('spec-text').value"
                           ".includes('from-the-browser')")
    assert not page.locator("#spec-json").is_checked()
    page.fill("#submission-id", "browser-1")
    page.click("#submit-btn")
    page.wait_for_url("**/jobs/job-*")
    assert page.locator("#job-name").inner_text() == "from-the-browser"
    with bearer(server) as api:
        job = api.get(page.url.replace(server.url, "").replace("/jobs/", "/v1/jobs/")).json()
        assert job["submission_id"] == "browser-1" and job["owner"] == "admin"
    # The page's session cannot submit without the page's CSRF token.
    status = page.evaluate("""async () => (await fetch('/v1/jobs', {method: 'POST',
        credentials: 'same-origin', headers: {'Content-Type': 'application/yaml'},
        body: 'name: forged'})).status""")
    assert status == 403
    assert all("status of 403" in e for e in page.errors), page.errors


def test_a_viewer_gets_no_submit_form_cancel_or_stacks_button(browser: Any, server: Server,
                                                              nodes: list[str]) -> None:
    job = submit(server.store, spec_doc("viewed", dp_replicate=2))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(server.store, job, nodes[6:7])
    token = server.store.create_token("vera", role=Role.VIEWER)
    ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        p = ctx.new_page()
        p.goto("/login")
        p.fill("#token", token)
        p.click("#login-submit")
        p.wait_for_url(server.url + "/")
        assert p.locator("#nav-submit").count() == 0
        p.goto("/submit")
        assert p.locator("#submit-form").count() == 0 and "cannot submit" in p.inner_text("main")
        p.goto(f"/jobs/{job.id}")
        p.locator("#rank-body tr").first.wait_for()
        assert p.locator("#cancel-btn").count() == 0 and p.locator("#stacks-btn").count() == 0
    finally:
        ctx.close()


def test_cluster_page_updates_live(page: Any, server: Server, nodes: list[str],
                                   artifacts_dir: Path) -> None:
    page.goto("/cluster")
    page.evaluate("window.__noReload = 1")
    row = page.locator(f"#node-{nodes[3]}")
    row.wait_for()
    assert "8 free / 0 used" in row.inner_text()
    job = submit(server.store, spec_doc("arrives-live", dp_replicate=4, steps=500))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(server.store, job, nodes[3:4])
    add_node_usage(server.store, [nodes[3]])
    row.locator('[data-col="holders"]', has_text="arrives-live").wait_for(timeout=8000)
    assert "4 free / 4 used" in row.inner_text()
    health = row.locator('[data-col="health"]')
    assert health.locator(".badge").inner_text().strip() == "healthy"
    assert health.locator("button.cordon").inner_text() == "Cordon"  # the page's user is admin
    cordoned = bearer(server).post(f"/v1/nodes/{nodes[3]}/cordon",
                                   json={"reason": "bad DIMM on GPU 2"})
    assert cordoned.status_code == 200, cordoned.text
    health.locator(".badge.health-cordoned").wait_for(timeout=8000)
    assert "bad DIMM on GPU 2" in health.inner_text() and "until" in health.inner_text()
    row.locator('[data-col="cpu"]', has_text="%").wait_for(timeout=12_000)
    assert "2.0 TiB" in row.locator('[data-col="mem"]').inner_text()
    gpus = row.locator('[data-col="gpu-util"]')
    assert "mean 44%" in gpus.inner_text() and gpus.locator("rect.gpu-bar").count() == 8
    assert gpus.locator("rect.gpu-bar title").nth(7).text_content().startswith("GPU 7: 47%")
    assert row.locator('[data-col="trend"] path.spark-line').count() == 1
    server.store.upsert_node(name="joined-late", labels={"leaf": "leaf-z"}, gpus=2, cpus=8.0,
                             topology={})
    page.locator("#node-joined-late").wait_for(timeout=8000)
    assert page.evaluate("window.__noReload") == 1
    shoot(page, artifacts_dir, "cluster-live")
    assert page.errors == []


def test_a_finished_job_drops_cancel_and_stops_its_heartbeat_clock(
        page: Any, server: Server, nodes: list[str]) -> None:
    job = submit(server.store, spec_doc("finishes", dp_replicate=2, steps=3))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes[7:8], step=3)
    add_training(server.store, job, attempt, steps=3, ranks=1)
    page.goto(f"/jobs/{job.id}")
    page.evaluate("window.__noReload = 1")
    page.locator("#cancel-btn").wait_for(state="visible")
    assert page.locator("#jump-diagnosis").is_hidden()  # no diagnosis, no link to one
    # The goodput panel follows the job: a running job's wall time grows with each poll.
    first_goodput = page.locator("#goodput-ratio").inner_text()
    page.wait_for_function("(t) => document.getElementById('goodput-ratio').textContent "
                           "!== t", arg=first_goodput, timeout=8000)
    assert page.locator('#goodput-rows tr[data-bucket="productive"]').count() == 1
    assert page.locator("#goodput-bar rect.gp").count() >= 1
    walk(server.store, job.id, S.SUCCEEDED)
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'SUCCEEDED'")
    assert page.locator("#cancel-btn").is_hidden() and page.locator("#stacks-btn").is_hidden()
    hb = page.locator("#rank-0 td").nth(8)
    page.wait_for_function("() => document.querySelector('#rank-0 td:nth-child(9)')"
                           ".textContent.startsWith('last ')")
    first = hb.inner_text()
    page.wait_for_timeout(2500)  # more than a poll: a running clock would have moved
    assert hb.inner_text() == first
    assert page.evaluate("window.__noReload") == 1
    assert page.errors == []


def test_phone_jobs_list_shows_state_progress_and_culprit_without_sideways_scroll(
        page: Any, server: Server, nodes: list[str], artifacts_dir: Path) -> None:
    job = submit(server.store, spec_doc("phone-hung-job", dp_replicate=8, steps=100))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes[2:3], step=12)
    open_condition(server.store, job, attempt,
                   hang_report(world=8, culprit=5, mesh=MeshShape(dp_replicate=8),
                               nodes=nodes[2:3]))
    page.set_viewport_size(PHONE)
    page.goto("/?name=phone-hung")
    row = page.locator(f'tr[data-job-id="{job.id}"]')
    row.wait_for()
    for part in (".badge", "td.status", "td.progress-cell"):
        box = row.locator(part).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
        assert row.locator(part).is_visible()
    assert "rank 5 never entered" in row.locator("td.status").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shoot(page, artifacts_dir, "jobs-phone")
    assert page.errors == []


def test_axe_finds_nothing_on_any_page(page: Any, server: Server, nodes: list[str],
                                       tmp_path: Path) -> None:
    job = submit(server.store, spec_doc("axe-hung", dp_replicate=8, steps=100))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes[5:6], step=12)
    add_training(server.store, job, attempt, steps=12, ranks=1)
    add_usage(server.store, job, attempt, ranks=8, nodes=nodes[5:6])
    server.store.add_event(job.id, kind="warning", message="a warning event")
    open_condition(server.store, job, attempt,
                   hang_report(world=8, culprit=5, mesh=MeshShape(dp_replicate=8),
                               nodes=nodes[5:6]))
    found = {}
    for path, ready in (("/", "#jobs-body tr"), (f"/jobs/{job.id}", "#diag-evidence tr"),
                        ("/cluster", "#nodes-body tr"), ("/submit", "#spec-text")):
        for size in (DESKTOP, PHONE):
            page.set_viewport_size(size)
            page.goto(path)
            page.locator(ready).first.wait_for()
            page.wait_for_timeout(300)
            found[(path, size["width"])] = axe_violations(page)
    bad = {k: v for k, v in found.items() if v}
    assert not bad, "\n".join(f"{k}:\n{describe(v)}" for k, v in bad.items())
    assert page.errors == []


def test_artifact_links_work_with_a_bearer_token_as_well_as_the_cookie(
        page: Any, server: Server, nodes: list[str]) -> None:
    job = submit(server.store, spec_doc("artifacts", dp_replicate=8))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes[4:5])
    artifact = server.data_dir / "runs" / job.id / "diagnostics" / "stacks.txt"
    artifact.parent.mkdir(parents=True)
    artifact.write_text("rank 5 stacks\n")
    report = hang_report(world=8, culprit=5, mesh=MeshShape(dp_replicate=8), nodes=nodes[4:5],
                         artifacts=[str(artifact)])
    d = open_condition(server.store, job, attempt, report, since=time.time())
    page.goto(f"/jobs/{job.id}")
    link = page.locator("#diag-artifacts a").first
    link.wait_for()
    href = link.get_attribute("href") or ""
    assert href == f"/jobs/{job.id}/artifacts/{d}/0"
    with page.expect_download() as dl:
        link.click()
    assert Path(dl.value.path()).read_text() == "rank 5 stacks\n"
    with bearer(server) as api:
        r = api.get(href)
        assert r.status_code == 200 and r.text == "rank 5 stacks\n"
    with httpx.Client(base_url=server.url, timeout=10) as anon:
        r = anon.get(href, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/login"
        r = anon.get(href, headers={"Authorization": "Bearer not-a-token"})
        assert r.status_code == 401
    assert page.errors == []
