"""The jobs list for many jobs, in real headless Chromium against a real `meshyard serve`:
submitted time and duration columns, sorting, filters by state and owner, a 300-character
failure on one line (whole on hover and when expanded), bulk cancel with the page's CSRF
token, and clone / resubmit prefilling the submit form with a job's spec.

Jobs are written through the Store on the server's SQLite file (the scheduler is off).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lifecycle import JobState, Reason
from tests.e2e.axe import axe_violations, describe
from tests.e2e.conftest import Server, shoot
from tests.unit.dashboard.seed import spec_doc, submit, walk

pytestmark = [pytest.mark.browser, pytest.mark.integration]
S = JobState
GLOO = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:41234 while rank 2 waited in all_reduce #7 of process group dp; " * 3)


@pytest.fixture(scope="module")
def jobs(server: Server) -> dict[str, str]:
    store = server.store
    ids = {}
    for name, steps in (("list-b", 300), ("list-a", 100), ("list-c", 200)):
        job = submit(store, spec_doc(name, steps=steps), owner="lister")
        walk(store, job.id, S.PLACING, S.STARTING, S.RUNNING)
        ids[name] = job.id
    failed = submit(store, spec_doc("list-failed"), owner="lister")
    walk(store, failed.id, S.PLACING, S.STARTING, S.RUNNING)
    store.transition(failed.id, S.FAILED, reason=Reason.WORKER_CRASH, message=GLOO)
    ids["list-failed"] = failed.id
    other = submit(store, spec_doc("someone-else"), owner="other")
    ids["someone-else"] = other.id
    return ids


def _names(page: Any) -> list[str]:
    return page.locator("#jobs-body tr a.job-link").all_inner_texts()


def _heights(page: Any, *job_ids: str) -> list[float]:
    """The rendered heights of the jobs' rows, read together in one script."""
    return page.evaluate("""(ids) => ids.map((id) => document.querySelector(
        `tr[data-job-id="${id}"]`).getBoundingClientRect().height)""", list(job_ids))


def test_list_sorts_filters_and_shows_a_long_failure_on_one_line(
        page: Any, server: Server, jobs: dict[str, str], artifacts_dir: Path) -> None:
    page.goto("/?owner=lister")
    page.wait_for_function("() => document.querySelectorAll('#jobs-body tr').length === 4")
    assert "someone-else" not in _names(page)
    assert _names(page)[0] == "list-failed"  # newest submitted first
    head = page.locator("#jobs-table thead th")
    assert [t.strip() for t in head.all_inner_texts()][-3:] == ["Submitted", "Started",
                                                                "Duration"]
    page.click("th[data-sort=name] button")
    assert _names(page) == ["list-a", "list-b", "list-c", "list-failed"]
    assert page.locator("th[data-sort=name]").get_attribute("aria-sort") == "ascending"
    page.click("th[data-sort=name] button")
    assert _names(page) == ["list-failed", "list-c", "list-b", "list-a"]
    # The order holds across the 2 s refresh.
    page.wait_for_timeout(2300)
    assert _names(page) == ["list-failed", "list-c", "list-b", "list-a"]
    # A 300-character gloo error: one line (the row as tall as its neighbours), the whole text
    # in the title, and whole once expanded.
    row = page.locator(f'tr[data-job-id="{jobs["list-failed"]}"]')
    clip = row.locator("td.status button.clip")
    assert (clip.get_attribute("title") or "").strip() == GLOO.strip()
    # measured in one script: the 2 s refresh builds the rows again, and a row measured
    # through two calls may be the old one, detached, by the second
    tall, other = _heights(page, jobs["list-failed"], jobs["list-a"])
    assert tall <= other + 4, (tall, other)
    clip.click()
    assert clip.get_attribute("aria-expanded") == "true"
    assert _heights(page, jobs["list-failed"])[0] > tall + 20
    clip.press("Enter")
    assert clip.get_attribute("aria-expanded") == "false"
    page.select_option("#f-state", "FAILED")
    page.wait_for_function("() => document.querySelectorAll('#jobs-body tr').length === 1")
    assert _names(page) == ["list-failed"] and "state=FAILED" in page.url
    shoot(page, artifacts_dir, "jobs-list-failed")
    found = axe_violations(page)
    assert not found, describe(found)
    assert page.errors == []


def test_bulk_cancel_sends_the_csrf_token_and_cancels_only_the_selected(
        page: Any, server: Server, jobs: dict[str, str]) -> None:
    posts: list[tuple[str, str | None]] = []
    page.on("request", lambda r: posts.append((r.url, r.headers.get("x-csrf-token")))
            if r.method == "POST" else None)
    page.goto("/?owner=lister&state=active")
    page.wait_for_function("() => document.querySelectorAll('#jobs-body tr').length >= 2")
    a, b = jobs["list-a"], jobs["list-b"]
    assert page.locator("#bulk-cancel").is_disabled()
    page.check(f'tr[data-job-id="{a}"] input[data-pick]')
    page.check(f'tr[data-job-id="{b}"] input[data-pick]')
    page.wait_for_timeout(2300)  # the selection survives a refresh
    assert page.locator(f'tr[data-job-id="{a}"] input[data-pick]').is_checked()
    assert page.locator("#bulk-cancel").inner_text() == "Cancel 2 selected"
    page.click("#bulk-cancel")
    assert page.locator("#bulk-cancel").inner_text() == "Confirm: cancel 2 jobs"
    assert posts == []  # the first click only arms
    page.click("#bulk-cancel")
    page.wait_for_function("() => document.querySelector('#bulk-status').textContent"
                           ".startsWith('cancel requested for 2 of 2')")
    assert sorted(u.rsplit("/", 2)[-2] for u, _ in posts) == sorted([a, b])
    assert all(token for _, token in posts), posts
    for jid in (a, b):
        assert server.store.get_job(jid).state in (S.CANCELLING, S.CANCELLED)
    assert server.store.get_job(jobs["list-c"]).state == S.RUNNING
    # Finished jobs offer no box to tick.
    page.goto("/?owner=lister&state=FAILED")
    page.locator("#jobs-body tr").first.wait_for()
    assert page.locator("#jobs-body tr input[data-pick]").first.is_disabled()
    assert page.errors == []


def test_clone_prefills_the_submit_form_with_the_jobs_spec(
        page: Any, server: Server, jobs: dict[str, str]) -> None:
    jid = jobs["list-c"]
    page.goto(f"/jobs/{jid}")
    page.click("#clone-link")
    page.wait_for_url(f"**/submit?from={jid}")
    page.wait_for_function("() => document.querySelector('#spec-text').value.startsWith('{')")
    spec = json.loads(page.input_value("#spec-text"))
    assert spec["name"] == "list-c" and spec["training"]["steps"] == 200
    assert page.locator("#spec-json").is_checked()
    assert "list-c" in page.locator("#submit-status").inner_text()
    page.click("#submit-btn")
    page.wait_for_url("**/jobs/job-*")
    new_id = page.url.rsplit("/", 1)[-1]
    assert new_id != jid
    clone = server.store.get_job(new_id)
    assert clone is not None and clone.name == "list-c" and clone.spec.training.steps == 200
    assert page.errors == []


def test_a_reservation_and_a_preemption_read_in_the_list(page: Any, server: Server) -> None:
    """A queued gang with a reservation says what it waits for and when it expects to start
    (the reason the live scheduler writes), and a job being preempted shows as PREEMPTED,
    counted among the active jobs and found by its state."""
    import time

    from orchestrator.placement.gang_plan import Pending, PendingKind
    from orchestrator.scheduling.reservation import Reservation

    store = server.store
    victim = submit(store, spec_doc("res-victim"), owner="reserver")
    walk(store, victim.id, S.PLACING, S.STARTING, S.RUNNING)
    big = submit(store, spec_doc("res-big"), owner="reserver")
    now = time.time()
    reason = Reservation(job_id=big.id, gpus={"n1": (0, 1)}, start=now + 600,
                         waits_for=(victim.id,)).reason(
        Pending(PendingKind.WAITING, "needs 2 free GPUs; 0 are free"), now=now)
    store.set_pending_reason(big.id, reason)
    page.goto("/?owner=reserver")
    row = page.locator(f'tr[data-job-id="{big.id}"]')
    row.locator("td.status", has_text="reserved 2 GPUs on n1").wait_for()
    text = row.locator("td.status").inner_text()
    assert f"waiting for {victim.id} to end" in text and "expected start" in text, text
    store.transition(victim.id, S.PREEMPTED, reason=Reason.PREEMPTED,
                     message=f"preempted for {big.id}")
    page.locator(f'tr[data-job-id="{victim.id}"] .badge.state-preempted',
                 has_text="PREEMPTED").wait_for()
    page.select_option("#f-state", "PREEMPTED")
    page.wait_for_function("() => document.querySelectorAll('#jobs-body tr').length === 1")
    page.select_option("#f-state", "active")
    page.wait_for_function("() => document.querySelectorAll('#jobs-body tr').length === 2")
    assert page.errors == []
