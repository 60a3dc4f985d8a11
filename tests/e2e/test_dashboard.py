"""The dashboard in real headless Chromium against a real `meshyard serve`.

Job states are driven through the Store on the server's own SQLite file (the scheduler is off),
exactly the writes the runtime makes; the browser only ever sees what the server serves.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.mesh import MeshShape
from tests.e2e.conftest import DESKTOP, Server, shoot
from tests.unit.dashboard.seed import (
    XSS_NAME,
    hang_report,
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


def row_state(page: Any, job_id: str) -> Any:
    return page.locator(f'tr[data-job-id="{job_id}"] .badge')


def test_wrong_token_is_refused(browser: Any, server: Server, artifacts_dir: Path) -> None:
    ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        p = ctx.new_page()
        response = p.goto("/")
        assert p.url == server.url + "/login" and response is not None
        p.fill("#token", "not-a-real-token")
        with p.expect_response(lambda r: r.url.endswith("/login")
                               and r.request.method == "POST") as posted:
            p.click("#login-submit")
        assert posted.value.status == 401
        assert "not valid" in p.locator("#login-error").inner_text()
        assert ctx.cookies() == []
        assert "not-a-real-token" not in p.url
        shoot(p, artifacts_dir, "login-refused")
        p.goto("/cluster")
        assert p.url == server.url + "/login"
    finally:
        ctx.close()


def test_login_sets_strict_httponly_cookie_and_jobs_update_live(
        page: Any, context: Any, server: Server, artifacts_dir: Path) -> None:
    cookie = next(c for c in context.cookies() if c["name"] == "meshyard_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # scripts cannot read the token
    assert server.token not in page.url

    page.evaluate("window.__noReload = 'still here'")
    with server.client() as api:
        resp = api.post("/v1/jobs", json=spec_doc("live-updates", dp_replicate=2, steps=50))
        assert resp.status_code == 201, resp.text
        job = resp.json()
    badge = row_state(page, job["id"])
    badge.wait_for()
    assert badge.inner_text() == "QUEUED"
    assert page.locator(f'tr[data-job-id="{job["id"]}"] a.job-link').inner_text() == "live-updates"

    walk(server.store, job["id"], S.PLACING, S.STARTING, S.RUNNING)
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job-id='${id}'] .badge`).textContent === 'RUNNING'",
        arg=job["id"])
    assert "state-running" in (badge.get_attribute("class") or "")
    walk(server.store, job["id"], S.SUCCEEDED)
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job-id='${id}'] .badge`).textContent === 'SUCCEEDED'",
        arg=job["id"])
    assert page.evaluate("window.__noReload") == "still here"

    page.select_option("#f-state", "SUCCEEDED")
    page.wait_for_function("() => [...document.querySelectorAll('#jobs-body .badge')]"
                           ".every(b => b.textContent === 'SUCCEEDED')")
    assert "state=SUCCEEDED" in page.url
    page.select_option("#f-state", "")
    shoot(page, artifacts_dir, "jobs")
    assert page.errors == []


def test_job_detail_shows_ranks_chart_and_placement(
        page: Any, server: Server, nodes: list[str], artifacts_dir: Path) -> None:
    from tests.unit.dashboard.seed import add_training

    job = submit(server.store, spec_doc("tp4-pp2-dp2", tp=4, pp=2, dp_replicate=2, steps=200))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes[:2], step=30)
    add_training(server.store, job, attempt, steps=30, ranks=16)

    page.goto(f"/jobs/{job.id}")
    page.locator("#rank-body tr").nth(15).wait_for()
    assert page.locator("#rank-body tr").count() == 16
    assert page.locator("#rank-5 td").nth(4).inner_text() == nodes[0]
    page.wait_for_function("() => Number(document.querySelector('#chart-loss svg')"
                           "?.dataset.points) === 30")
    assert page.locator("#chart-loss path.series").first.get_attribute("d")
    assert page.locator("#chart-tput path.series").count() >= 1

    cells = page.locator(".pm-gpu.used")
    cells.nth(15).wait_for()
    groups = Counter(cells.nth(i).get_attribute("data-tp-group") for i in range(cells.count()))
    assert len(groups) == 4 and set(groups.values()) == {4}  # 16 ranks / tp 4
    assert page.locator(".pm-node").count() == 2
    assert page.locator(".pm-group").count() == 1  # both nodes under leaf-a
    assert page.locator(".pm-nvlink").count() >= 2  # NVSwitch bar per node
    assert page.locator("#comm-table tbody tr").count() == 3  # tp, dp_replicate, pp
    assert "NV18" in page.locator("#comm-table").inner_text()
    page.locator("#log-tail").filter(has_text="rank 0 step 1").wait_for()
    page.wait_for_function("() => document.querySelectorAll('#events li').length >= 4")
    shoot(page, artifacts_dir, "job-detail")
    assert page.errors == []


def test_cancel_with_the_button(page: Any, server: Server, nodes: list[str]) -> None:
    job = submit(server.store, spec_doc("to-cancel", dp_replicate=2, steps=500))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(server.store, job, nodes[3:4])
    page.goto(f"/jobs/{job.id}")
    page.wait_for_function("() => document.getElementById('job-state').textContent === 'RUNNING'")
    page.click("#cancel-btn")
    assert page.locator("#cancel-btn").inner_text() == "Confirm cancel"
    page.click("#cancel-btn")
    page.wait_for_function(
        "() => document.getElementById('job-state').textContent === 'CANCELLING'")
    record = server.store.get_job(job.id)
    assert record is not None and record.state == S.CANCELLING
    assert page.locator("#cancel-btn").is_disabled()
    walk(server.store, job.id, S.CANCELLED)
    page.wait_for_function(
        "() => document.getElementById('job-state').textContent === 'CANCELLED'")
    assert page.dialogs == []


def test_cancel_without_csrf_header_is_refused(page: Any, server: Server) -> None:
    job = submit(server.store, spec_doc("csrf-target"))
    status = page.evaluate("""async id => (await fetch(`/v1/jobs/${id}/cancel`,
        {method: 'POST', credentials: 'same-origin'})).status""", job.id)
    assert status == 403
    record = server.store.get_job(job.id)
    assert record is not None and record.state == S.QUEUED


def test_diagnosis_highlights_the_culprit(page: Any, server: Server, nodes: list[str],
                                          artifacts_dir: Path) -> None:
    job = submit(server.store, spec_doc("hung-dp", dp_replicate=8, steps=100))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes[4:5], step=12)
    artifact = server.data_dir / "runs" / job.id / "fr_rank5.txt"
    artifact.parent.mkdir(parents=True)
    artifact.write_text("flight recorder dump of rank 5\n")
    report = hang_report(world=8, culprit=5, mesh=MeshShape(dp_replicate=8), nodes=nodes[4:5],
                         artifacts=[str(artifact)])
    server.store.add_diagnosis(job.id, attempt, verdict=report.verdict.value,
                               culprit_ranks=[5], summary=report.summary,
                               report=report.to_dict())
    walk(server.store, job.id, S.FAILED)

    page.goto(f"/jobs/{job.id}")
    page.locator("#diagnosis").wait_for(state="visible")
    assert page.locator("#diag-summary").inner_text() == report.summary
    assert page.locator("#diag-verdict").inner_text() == "NOT_JOINED"
    page.locator('.pm-gpu.culprit[data-rank="5"]').wait_for()
    assert page.locator(".pm-gpu.culprit").count() == 1
    page.locator("tr#rank-5.culprit").wait_for()
    assert page.locator("#rank-body tr.culprit").count() == 1
    assert page.locator('#diag-evidence tr.culprit[data-rank="5"]').count() == 1
    assert page.locator("#diag-mismatches tr").count() == 1
    assert page.locator("#diag-recs li").count() == 2
    stack = page.locator("details.stack.culprit")
    assert stack.get_attribute("open") is not None and "next_batch" in stack.inner_text()
    with page.expect_download() as dl:
        page.click("#diag-artifacts a")
    assert Path(dl.value.path()).read_text() == "flight recorder dump of rank 5\n"
    shoot(page, artifacts_dir, "diagnosis")
    assert page.errors == []


def test_script_in_a_job_name_stays_text(page: Any, server: Server) -> None:
    job = submit(server.store, spec_doc(XSS_NAME))
    server.store.add_event(job.id, kind="warning", message=XSS_NAME)
    page.goto("/?name=" + "onerror")
    link = page.locator(f'tr[data-job-id="{job.id}"] a.job-link')
    link.wait_for()
    assert link.inner_text() == XSS_NAME
    page.goto(f"/jobs/{job.id}")
    warning = page.locator("#events li.ev-warning .ev-msg")
    warning.wait_for()
    assert warning.inner_text() == XSS_NAME
    assert page.locator("#job-name").inner_text() == XSS_NAME
    assert page.title().startswith(XSS_NAME)
    assert page.locator("img").count() == 0
    page.wait_for_timeout(300)  # let any injected handler fire (it must not)
    assert page.dialogs == [] and page.errors == []


def test_cluster_page_shows_usage_and_levels(page: Any, server: Server, nodes: list[str],
                                             artifacts_dir: Path) -> None:
    job = submit(server.store, spec_doc("holds-gpus", dp_replicate=4, steps=500))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(server.store, job, nodes[7:8])
    page.goto("/cluster")
    for name in nodes:  # other tests may add nodes to this shared server
        assert page.locator(f"#node-{name}").count() == 1
    row = page.locator(f"#node-{nodes[7]}")
    assert "4 free / 4 used" in row.inner_text() and "holds-gpus" in row.inner_text()
    tree = page.locator("#topology-tree").inner_text()
    assert "spine-0" in tree and "leaf-a" in tree and "leaf-b" in tree
    shoot(page, artifacts_dir, "cluster")
    assert page.errors == []


def test_pagination_and_owner_filter(page: Any, server: Server) -> None:
    server.store.create_user("pager")
    for i in range(120):
        submit(server.store, spec_doc(f"page-{i:03d}"), owner="pager")
    page.goto("/?owner=pager")
    rows = page.locator("#jobs-body tr")
    page.wait_for_function("() => document.querySelectorAll('#jobs-body tr').length === 50")
    assert rows.first.locator("a.job-link").inner_text() == "page-119"  # newest first
    page.click("#next")
    page.wait_for_function("() => document.querySelector('#jobs-body a.job-link')"
                           ".textContent === 'page-069'")
    assert page.locator("#page-label").inner_text() == "page 2"
    page.click("#next")
    page.wait_for_function("() => document.querySelectorAll('#jobs-body tr').length === 20")
    assert rows.last.locator("a.job-link").inner_text() == "page-000"
    assert page.locator("#next").is_disabled()
    page.click("#prev")
    page.wait_for_function("() => document.querySelector('#jobs-body a.job-link')"
                           ".textContent === 'page-069'")
    page.fill("#f-owner", "nobody-has-this-name")
    page.locator("#jobs-empty").wait_for(state="visible")
    assert page.locator("#page-label").inner_text() == "page 1"


def test_queued_job_says_why_it_is_pending_then_shows_its_placement(
        page: Any, server: Server, nodes: list[str]) -> None:
    job = submit(server.store, spec_doc("waits", dp_replicate=4))
    server.store.set_pending_reason(job.id, {"kind": "waiting", "message": "needs 4 GPUs; 1 free",
                                             "free_gpus": 1})
    page.goto(f"/jobs/{job.id}")
    page.locator("#pending").wait_for(state="visible")
    text = page.locator("#pending-text").inner_text()
    assert text == "needs 4 GPUs; 1 free"  # the sentence; its numbers stay in the API
    page.locator("#comm-note", has_text="once every rank is placed").wait_for()
    # Placed while the page is open: the map, the cost estimate and the header follow.
    server.store.set_pending_reason(job.id, None)
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(server.store, job, nodes[5:6])
    page.locator("#comm-table", has_text="NV18").wait_for()
    page.wait_for_function("() => document.querySelectorAll('.pm-gpu.used').length === 4")
    assert page.locator("#pending").is_hidden()


def test_expert_parallel_job_shows_its_ep_coordinates_and_all_to_all_row(
        page: Any, server: Server, nodes: list[str]) -> None:
    job = submit(server.store, spec_doc("moe-ep4", dp_shard=2, ep=4))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(server.store, job, nodes[:1], step=3)
    page.goto(f"/jobs/{job.id}")
    page.wait_for_function("() => document.querySelectorAll('.pm-gpu.used').length === 8")
    labels = page.evaluate("() => [...document.querySelectorAll('.pm-labels .pm-coord')]"
                           ".map(t => t.textContent)")
    assert labels[:5] == ["d0 e0", "d0 e1", "d0 e2", "d0 e3", "d1 e0"]
    assert "ep 1" in page.locator('.pm-gpu[data-rank="1"] title').first.text_content()
    page.locator("#comm-table", has_text="NV18").wait_for()
    rows = page.evaluate("() => [...document.querySelectorAll('#comm-table tbody tr')]"
                         ".map(r => [r.cells[0].textContent, r.cells[1].textContent, "
                         "r.cells[2].textContent, r.cells[7].textContent])")
    # FSDP over dp_shard (all-gather, reduce-scatter) and the EP group's all-to-all, whose
    # 4 ranks sit on one node's NVSwitch.
    assert ["ep", "4", "all_to_all", "NV18 (450 GB/s)"] in rows
    assert sorted(r[0] for r in rows) == ["dp_shard", "dp_shard", "ep"]
    assert page.errors == []


def test_512_ranks_table_filter_and_map(page: Any, server: Server) -> None:
    from orchestrator.topology.model import NodeTopology
    from orchestrator.topology.serialize import node_topology_to_dict

    names = [f"big-{i:02d}" for i in range(64)]
    for i, name in enumerate(names):
        server.store.upsert_node(name=name, labels={"leaf": f"leaf-{i // 16}", "spine": "s0"},
                                 gpus=8, topology=node_topology_to_dict(
                                     NodeTopology.uniform(8, "NV18")))
    job = submit(server.store, spec_doc("big-512", tp=8, pp=4, dp_replicate=16))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    place(server.store, job, names, step=3)
    page.goto(f"/jobs/{job.id}")
    page.wait_for_function("() => document.querySelectorAll('#rank-body tr').length === 512 "
                           "&& document.querySelectorAll('.pm-gpu.used').length === 512")
    groups = page.evaluate("() => { const c = {}; document.querySelectorAll('.pm-gpu.used')"
                           ".forEach(g => { c[g.dataset.tpGroup] = (c[g.dataset.tpGroup] || 0)"
                           " + 1; }); return Object.values(c); }")
    assert len(groups) == 64 and set(groups) == {8}
    assert page.locator(".pm-group").count() == 4  # leaf-0..leaf-3
    page.fill("#rank-filter", "big-63")
    page.wait_for_function("() => document.getElementById('rank-count').textContent "
                           "=== '8 of 512 ranks'")
    assert page.locator("#rank-511").is_visible()
    page.click('.pm-gpu[data-rank="300"]')
    assert page.locator("#rank-filter").input_value() == "300"
    assert page.locator("#rank-300").is_visible()
