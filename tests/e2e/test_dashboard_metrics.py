"""Every reported metric on the job page, in real headless Chromium against a real `meshyard
serve`: a user metric charted, val_* against its train series, every rank overlaid, a zoom by
typed range and by drag, and a 3,000-step job drawn from server-downsampled series whose
payload stays bounded (the raw rows are never fetched by the page).

Rows are written through the Store on the server's SQLite file (the scheduler is off),
exactly the rows the runtime writes for `meshyard.train.report({...})`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lifecycle import JobState
from tests.e2e.axe import axe_violations, describe
from tests.e2e.conftest import Server, shoot
from tests.unit.dashboard.seed import place, seed_cluster, spec_doc, submit, walk

pytestmark = [pytest.mark.browser, pytest.mark.integration]
S = JobState
STEPS = 3000


@pytest.fixture(scope="module")
def nodes(server: Server) -> list[str]:
    return seed_cluster(server.store)


@pytest.fixture(scope="module")
def long_job(server: Server, nodes: list[str]) -> str:
    """A 2-rank job with 3,000 steps of loss and of the user's val_loss, val_acc and mfu, and
    one val_loss spike at step 2222."""
    job = submit(server.store, spec_doc("user-metrics", dp_replicate=2, steps=STEPS))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes[0:1], step=STEPS)
    t0 = time.time() - STEPS
    rows = [{"rank": r, "step": s, "time": t0 + s, "loss": 4.0 / (1 + s / 300) + 0.01 * r,
             "grad_norm": 1.0, "step_time_s": 0.25, "tokens_per_s": 1000.0 + s, "lr": 3e-4,
             "val_loss": 4.2 / (1 + s / 300) + (30.0 if s == 2222 else 0.0),
             "val_acc": 0.3 + 0.6 * s / STEPS + 0.05 * r, "mfu": 0.41}
            for s in range(1, STEPS + 1) for r in range(2)]
    for i in range(0, len(rows), 2000):
        server.store.add_metrics(job.id, attempt, rows[i:i + 2000])
    return job.id


def _points(page: Any, chart: str) -> int:
    return int(page.locator(f"{chart} svg").get_attribute("data-points") or 0)


def test_user_metrics_are_charted_against_train_per_rank_and_zoomed(
        page: Any, server: Server, long_job: str, artifacts_dir: Path) -> None:
    sizes: list[tuple[str, int]] = []
    page.on("response", lambda r: sizes.append((r.url, len(r.body())))
            if "/metrics" in r.url else None)
    page.goto(f"/jobs/{long_job}")
    acc = '#charts figure[data-metric="val_acc"] .chart'
    page.locator(f"{acc} svg").wait_for()
    # The user's keys get figures of their own; val_loss is drawn in the loss figure.
    assert page.locator('#charts figure[data-metric="val_acc"] figcaption').inner_text() \
        == "val_acc"
    assert page.locator('#charts figure[data-metric="mfu"] svg').count() == 1
    assert page.locator('#charts figure[data-metric="val_loss"]').count() == 0
    loss = page.locator("#chart-loss svg")
    assert loss.get_attribute("data-series") == "2"
    assert page.locator("#chart-loss").locator("xpath=..").locator(
        "ul.legend li").all_inner_texts() == ["loss (train)", "val_loss"]
    # Downsampled on the server: 300 buckets a series, the spike kept as a band's max.
    assert _points(page, "#chart-loss") == 600 and int(loss.get_attribute("data-banded")) == 2
    top = max(float(t) for t in page.locator("#chart-loss .y-tick").all_text_contents())
    assert top >= 25, top  # the y axis reaches the spike (30 above the curve)
    # Bounded payloads, and never the raw rows.
    assert sizes and all("/metrics/series?" in u for u, _ in sizes), sizes
    assert max(n for _, n in sizes) < 120_000 and sum(n for _, n in sizes) < 200_000, sizes
    # Every rank: two series per key.
    page.check("#chart-ranks")
    page.wait_for_function(f"() => document.querySelector('{acc} svg')?.dataset.series === '2'")
    assert page.locator(acc).locator("xpath=..").locator("ul.legend li").all_inner_texts() \
        == ["rank 0", "rank 1"]
    page.uncheck("#chart-ranks")
    page.wait_for_function(f"() => document.querySelector('{acc} svg')?.dataset.series === '1'")
    # A typed range: 100 steps come back row by row, the spike itself at step 2222.
    page.fill("#chart-from", "2200")
    page.fill("#chart-to", "2299")
    page.press("#chart-to", "Enter")
    page.locator("#chart-to").blur()
    page.wait_for_function("() => document.querySelector('#chart-loss svg')"
                           "?.dataset.points === '200'")
    assert page.locator("#chart-loss svg").get_attribute("data-banded") == "0"
    assert page.locator("#chart-zoom-reset").is_visible()
    ticks = [int(t) for t in page.locator("#chart-loss .x-tick").all_text_contents()]
    assert ticks and min(ticks) >= 2200 and max(ticks) <= 2299, ticks
    page.click("#chart-zoom-reset")
    page.wait_for_function("() => document.querySelector('#chart-loss svg')"
                           "?.dataset.points === '600'")
    # A drag across a chart zooms every chart to the steps under it.
    box = page.locator("#chart-loss svg .hit").bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.25, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.4, y, steps=5)
    page.mouse.up()
    page.wait_for_function("() => document.querySelector('#chart-from').value !== ''")
    lo, hi = int(page.input_value("#chart-from")), int(page.input_value("#chart-to"))
    assert 600 < lo < 900 and 1050 < hi < 1350, (lo, hi)
    span = hi - lo + 1  # more steps than 300: buckets of 2 steps
    page.wait_for_function(f"() => Number(document.querySelector('{acc} svg')?.dataset.points)"
                           f" === {-(-span // 2)}")
    shoot(page, artifacts_dir, "job-user-metrics")
    found = axe_violations(page)
    assert not found, describe(found)
    assert page.errors == []
