"""The dashboard against a `meshyard serve` that really runs jobs (local Ray, gloo on CPU):
a submitted job appears, goes RUNNING and SUCCEEDED on the open page without a reload, its
detail page shows the real ranks, metrics and logs; a running job is cancelled by the button;
an injected hang is diagnosed by the watchdog and its culprit is highlighted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Server, run_server, shoot

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
RUN_MS = 120_000  # a CPU job's workers import torch first: seconds on a busy 2-core machine

TINY = {"kind": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 32, "vocab_size": 64,
        "seq_len": 16}

# Records every state the jobs table shows for one job: the table is rebuilt on each poll, so
# a MutationObserver sees each badge the page ever displayed, without a reload in between.
WATCH_ROW = """id => {
  window.__seen = [];
  const body = document.getElementById('jobs-body');
  const note = () => {
    const b = body.querySelector(`tr[data-job-id='${id}'] .badge`);
    const s = b && b.textContent;
    if (s && window.__seen[window.__seen.length - 1] !== s) window.__seen.push(s);
  };
  new MutationObserver(note).observe(body, {childList: true, subtree: true});
  note();
}"""


def tiny_job(name: str, steps: int) -> dict[str, Any]:
    return {"name": name, "parallelism": {"dp_replicate": 2},
            "resources": {"cpus_per_worker": 0.25}, "model": dict(TINY),
            "training": {"steps": steps, "micro_batch_size": 2, "lr": 0.01}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tmp_path_factory.mktemp("meshyard-e2e-rt"), scheduler=True,
                    extra_args=("--allow-fault-injection",)) as s:
        yield s


def test_submitted_job_runs_to_success_live(page: Any, server: Server,
                                            artifacts_dir: Path) -> None:
    page.evaluate("window.__noReload = 1")
    with server.client() as api:
        resp = api.post("/v1/jobs", json=tiny_job("real-run", steps=150))
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
    page.locator(f'tr[data-job-id="{job_id}"]').wait_for()
    page.evaluate(WATCH_ROW, job_id)
    page.wait_for_function("() => window.__seen.includes('SUCCEEDED') || "
                           "window.__seen.includes('FAILED')", timeout=RUN_MS)
    seen = page.evaluate("window.__seen")
    assert seen[-1] == "SUCCEEDED", (seen, (server.data_dir / "serve.log").read_text()[-3000:])
    # the row changed state live at least once before SUCCEEDED; a short RUNNING phase can fall
    # between two 2 s polls, so RUNNING itself is checked on the timeline below (FIRST_STEP)
    assert len(seen) >= 2 and set(seen[:-1]) <= {"QUEUED", "PLACING", "STARTING", "RUNNING"}, seen
    assert page.evaluate("window.__noReload") == 1
    page.locator(f'tr[data-job-id="{job_id}"]', has_text="150 / 150").wait_for()

    page.goto(f"/jobs/{job_id}")
    page.locator("#rank-body tr").nth(1).wait_for()
    assert page.locator("#rank-body tr").count() == 2
    page.wait_for_function("() => Number(document.querySelector('#chart-loss svg')"
                           "?.dataset.points) === 150")
    assert page.locator(".pm-gpu.used").count() == 2  # CPU ranks drawn as slots of their node
    page.locator("#events li").filter(has_text="FIRST_STEP").first.wait_for()
    page.locator("#log-tail").filter(has_text="[0]").wait_for()
    shoot(page, artifacts_dir, "real-job")
    assert page.errors == []


def test_cancel_a_running_job_with_the_button(page: Any, server: Server) -> None:
    with server.client() as api:
        job_id = api.post("/v1/jobs", json=tiny_job("real-cancel", steps=100_000)).json()["id"]
    page.goto(f"/jobs/{job_id}")
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'RUNNING'", timeout=RUN_MS)
    page.click("#cancel-btn")
    page.click("#cancel-btn")
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'CANCELLED'", timeout=RUN_MS)
    page.locator("#events li").filter(has_text="USER_CANCELLED").first.wait_for()
    record = server.store.get_job(job_id)
    assert record is not None and record.state.value == "CANCELLED"


def test_injected_hang_diagnosis_highlights_the_culprit(page: Any, server: Server,
                                                        artifacts_dir: Path) -> None:
    spec = tiny_job("real-hang", steps=8)
    spec["parallelism"] = {"dp_replicate": 3}
    spec["checkpoint"] = {"enabled": False}
    spec["fault_tolerance"] = {"max_failures": 0, "init_timeout_s": 60,
                               "collective_timeout_s": 60}
    spec["watchdog"] = {"stall_timeout_s": 3, "first_step_timeout_s": 120, "action": "fail"}
    spec["inject_fault"] = {"kind": "hang", "rank": 1, "step": 3}
    with server.client() as api:
        resp = api.post("/v1/jobs", json=spec)
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
    page.goto(f"/jobs/{job_id}")
    page.locator("#diagnosis").wait_for(state="visible", timeout=RUN_MS)
    assert "Rank 1" in page.locator("#diag-summary").inner_text()
    assert page.locator("#diag-verdict").inner_text() == "NOT_JOINED"
    page.locator('.pm-gpu.culprit[data-rank="1"]').wait_for()
    assert page.locator(".pm-gpu.culprit").count() == 1
    page.locator("tr#rank-1.culprit").wait_for()
    assert page.locator("#rank-body tr.culprit").count() == 1
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'FAILED'", timeout=RUN_MS)
    assert page.locator("#diag-evidence tr").count() == 3
    assert page.locator("#diag-artifacts a").count() >= 1
    with page.expect_download() as dl:
        page.locator("#diag-artifacts a").first.click()
    assert Path(dl.value.path()).stat().st_size > 0
    shoot(page, artifacts_dir, "real-hang")
    assert page.errors == []


def test_user_code_job_from_the_cli_shows_on_every_page(page: Any, server: Server,
                                                         artifacts_dir: Path) -> None:
    """The newcomer's path: `meshyard submit spec.yaml --working-dir DIR` with the Ray Train
    port (examples/byo/raytrain), then the job list, job page, ranks, chart and logs."""
    import subprocess

    from tests.e2e.conftest import _meshyard

    example = Path(__file__).resolve().parents[2] / "examples" / "byo" / "raytrain"
    out = subprocess.run([*_meshyard(), "submit", str(example / "spec.yaml"), "--working-dir",
                          str(example), "--url", server.url, "--token", server.token, "--json"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    import json

    job = json.loads(out.stdout)
    job_id = job["id"]
    assert job["spec"]["entrypoint"]["working_dir"].startswith("package:sha256:")
    assert "model" not in job["spec"] and job["total_steps"] == 0
    page.goto("/")
    page.locator(f'tr[data-job-id="{job_id}"]').wait_for()
    page.locator(f'tr[data-job-id="{job_id}"] .badge', has_text="SUCCEEDED").wait_for(
        timeout=RUN_MS)
    page.goto(f"/jobs/{job_id}")
    page.locator("#rank-body tr").nth(1).wait_for()
    assert page.locator("#rank-body tr").count() == 2
    page.wait_for_function("() => Number(document.querySelector('#chart-loss svg')"
                           "?.dataset.points) === 2")  # one report per epoch
    page.locator("#events li").filter(has_text="PROCESSES_STARTED").first.wait_for()
    page.locator("#log-tail").filter(has_text="'epoch': 1").wait_for()
    shoot(page, artifacts_dir, "user-code-job")
    assert page.errors == []
