"""The dashboard against a `meshyard serve` that really runs jobs (local Ray, gloo on CPU; one
served runtime for the module): a submitted job appears, goes RUNNING and SUCCEEDED on the
open page without a reload, with its ranks, metrics, learning rate, checkpoints, utilisation
and logs; "stacks now" on a running job, then the cancel button; an injected hang shows in
the jobs list within one poll of its diagnosis and fails naming the culprit; a crashed rank's
own last output is in its log.

With MESHYARD_README_SHOT=1 the hang test also writes the project README's screenshot
(docs/images/job-hang-diagnosis.png, quantised to stay small).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import DESKTOP, REPO, Server, run_server, shoot

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
RUN_MS = 120_000  # a CPU job's workers import torch first: seconds on a busy 2-core machine
README_SHOT = REPO / "docs" / "images" / "job-hang-diagnosis.png"

TINY = {"kind": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 32, "vocab_size": 64,
        "seq_len": 16}

# Records every state the jobs table shows for one job: the table is rebuilt on each poll, so
# a MutationObserver sees each badge the page ever displayed, without a reload in between.
WATCH_ROW = """id => {
  window.__seen = [];
  const body = document.getElementById('jobs-body');
  const note = () => {
    const row = body.querySelector(`tr[data-job-id='${id}']`);
    const b = row && row.querySelector('.badge');
    const s = b && b.textContent;
    if (s && window.__seen[window.__seen.length - 1] !== s) window.__seen.push(s);
    if (row && row.querySelector('.cond-chip') && !window.__condAt) {
      window.__condAt = Date.now();
      window.__condText = row.querySelector('td.status').textContent;
    }
  };
  new MutationObserver(note).observe(body, {childList: true, subtree: true});
  note();
}"""


def tiny_job(name: str, steps: int, **over: Any) -> dict[str, Any]:
    spec = {"name": name, "parallelism": {"dp_replicate": 2},
            "resources": {"cpus_per_worker": 0.25}, "model": dict(TINY),
            "training": {"steps": steps, "micro_batch_size": 2, "lr": 0.01}}
    spec.update(over)
    return spec


def faulty_job(name: str, fault: dict[str, Any], **watchdog: Any) -> dict[str, Any]:
    return tiny_job(name, 8, parallelism={"dp_replicate": 3},
                    checkpoint={"enabled": False},
                    fault_tolerance={"max_failures": 0, "init_timeout_s": 60,
                                     "collective_timeout_s": 10},
                    watchdog={"stall_timeout_s": 3, "first_step_timeout_s": 120, **watchdog},
                    inject_fault=fault)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tmp_path_factory.mktemp("meshyard-e2e-rt"), scheduler=True,
                    extra_args=("--allow-fault-injection",),
                    # The default pool, less its prestarted rank processes: this module's
                    # user-code job is an uploaded package, which starts cold.
                    extra_env={"MESHYARD_USAGE_INTERVAL_S": "1",
                               "MESHYARD_NODE_USAGE_INTERVAL_S": "2",
                               "MESHYARD_WARM_POOL_USER_CODE": "0"}) as s:
        yield s


def submit(server: Server, spec: dict[str, Any]) -> str:
    with server.client() as api:
        resp = api.post("/v1/jobs", json=spec)
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])


def test_submitted_job_runs_to_success_live(page: Any, server: Server,
                                            artifacts_dir: Path) -> None:
    page.evaluate("window.__noReload = 1")
    job_id = submit(server, tiny_job("real-run", steps=150))
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
    assert page.locator("#chart-lr svg").get_attribute("data-points") == "150"
    assert page.locator("#chart-grad svg").get_attribute("data-points") == "150"
    page.locator(".pm-gpu.used").nth(1).wait_for()  # the placement map draws after its fetch
    assert page.locator(".pm-gpu.used").count() == 2  # CPU ranks drawn as slots of their node
    page.locator("#events li").filter(has_text="FIRST_STEP").first.wait_for()
    page.locator("#log-tail").filter(has_text="[0]").wait_for()
    # The built-in loop checkpoints every 50 steps and keeps 2.
    page.locator('#ckpt-body tr[data-step="150"]').wait_for()
    assert page.locator('#ckpt-body tr[data-step="50"] td').nth(4).inner_text() == "pruned"
    # Utilisation from the workers themselves: CPU and memory per rank, no GPU here.
    page.wait_for_function("() => Number(document.querySelector('#chart-mem svg')"
                           "?.dataset.series) === 2")
    assert page.locator("#fig-gpu").is_hidden()
    assert re.fullmatch(r"\d+(\.\d)? (MiB|GiB)", page.locator("#rank-1 td").nth(11).inner_text())
    # A finished job's page: no cancel button, the heartbeat clock stopped.
    assert page.locator("#cancel-btn").is_hidden()
    assert page.locator("#rank-0 td").nth(8).inner_text().startswith("last ")
    shoot(page, artifacts_dir, "real-job")
    page.goto("/cluster")
    page.locator('#nodes-body [data-col="cpu"]', has_text="%").first.wait_for(timeout=20_000)
    assert page.errors == []


def test_stacks_now_then_cancel_a_running_job_with_the_buttons(page: Any, server: Server,
                                                                artifacts_dir: Path) -> None:
    job_id = submit(server, tiny_job("real-cancel", steps=100_000))
    page.goto(f"/jobs/{job_id}")
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'RUNNING'", timeout=RUN_MS)
    page.locator("#stacks-btn").wait_for(state="visible")
    page.click("#stacks-btn")
    page.locator("#stacks-meta", has_text="from 2 rank(s)").wait_for(timeout=60_000)
    training = page.locator("#stacks-groups details.stack.training")
    assert training.count() >= 1
    assert all("run_training" in training.nth(i).inner_text() for i in range(training.count()))
    ranks = {r for i in range(training.count())
             for r in (training.nth(i).get_attribute("data-ranks") or "").split(",")}
    assert ranks == {"0", "1"}
    merged = page.locator('#stacks-groups details.stack[data-ranks="0,1"]')
    assert merged.count() >= 1  # identical stacks of both ranks shown once
    shoot(page, artifacts_dir, "real-stacks")
    page.click("#cancel-btn")
    page.click("#cancel-btn")
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'CANCELLED'", timeout=RUN_MS)
    page.locator("#events li").filter(has_text="USER_CANCELLED").first.wait_for()
    record = server.store.get_job(job_id)
    assert record is not None and record.state.value == "CANCELLED"
    assert page.locator("#cancel-btn").is_hidden() and page.locator("#stacks-btn").is_hidden()
    assert page.errors == []


def test_hang_shows_in_the_list_within_a_poll_and_fails_naming_the_culprit(
        page: Any, server: Server, artifacts_dir: Path) -> None:
    """watchdog.action observe: the job stays RUNNING and carries "hung since ..." until the
    collective timeout fails the waiting ranks; the job then fails as the hang."""
    job_id = submit(server, faulty_job("real-hang", {"kind": "hang", "rank": 1, "step": 3},
                                       action="observe"))
    page.goto("/?name=real-hang")
    page.locator(f'tr[data-job-id="{job_id}"]').wait_for()
    page.evaluate(WATCH_ROW, job_id)
    deadline = time.monotonic() + RUN_MS / 1000
    while not server.store.list_diagnoses(job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    (diagnosis,) = server.store.list_diagnoses(job_id)
    page.wait_for_function("() => window.__condAt", timeout=5000)
    lag_ms = page.evaluate("window.__condAt") - diagnosis.created_at.timestamp() * 1000
    assert lag_ms <= 2000 + 1000, lag_ms  # one 2 s poll, and the fetch that follows it
    text = page.evaluate("window.__condText")
    assert re.search(r"since \d\d:\d\d:\d\d — rank 1 never entered all_reduce #\d+", text), text

    page.goto(f"/jobs/{job_id}")
    page.locator("#condition").wait_for(state="visible")
    page.locator('.pm-gpu.culprit[data-rank="1"]').wait_for()
    page.locator("tr#rank-1.culprit").wait_for()
    assert page.locator("#rank-1 td").nth(9).inner_text().startswith("not_joined · all_reduce #")
    assert page.locator("#rank-0 td").nth(9).inner_text().startswith("waiting · all_reduce #")
    assert page.locator("#diag-title").inner_text() == "Hang: a rank never joined the collective"
    assert page.locator('#diag-evidence tr[data-rank="1"] .pg.behind').count() == 1
    page.wait_for_timeout(500)  # let the charts and map settle for the pictures
    shoot(page, artifacts_dir, "real-hang")
    if os.environ.get("MESHYARD_README_SHOT"):
        readme_shot(page, README_SHOT)

    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'FAILED'", timeout=RUN_MS)
    page.wait_for_function("() => document.getElementById('job-message').textContent"
                           ".startsWith('hang detected: Rank 1 ')")
    assert page.locator("#condition").is_hidden()
    assert page.locator("#diag-artifacts a").count() >= 1
    page.goto("/?name=real-hang")
    status = page.locator(f'tr[data-job-id="{job_id}"] td.status')
    status.filter(has_text="hang detected: Rank 1").wait_for()
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


def test_crashed_rank_own_last_output_and_message(page: Any, server: Server) -> None:
    job_id = submit(server, faulty_job("real-crash", {"kind": "crash", "rank": 2, "step": 3},
                                       action="fail"))
    page.goto(f"/jobs/{job_id}")
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'FAILED'", timeout=RUN_MS)
    assert page.locator("#job-message").inner_text().startswith("rank 2 on ")
    assert page.locator("#diag-title").inner_text() == "Crash: a rank exited"
    page.select_option("#log-rank", "2")
    page.locator("#log-tail").filter(
        has_text="[meshyard fault] crash: rank 2 exits at step 3").wait_for()
    assert page.errors == []


def test_crashed_script_names_the_rank_that_raised_and_its_peers_lost(
        page: Any, server: Server, tmp_path: Path) -> None:
    """A 3-rank script that reports nothing, whose rank 1 raises after some all_reduces: the
    rank table shows rank 1 failed and ranks 0 and 2 "peer lost" (not failed), the step
    column counts the collectives each rank ran, the charts say how to report instead of
    drawing empty panels, and no communication is estimated for a model it does not run."""
    import subprocess

    import yaml

    from tests.e2e.conftest import _meshyard

    code = REPO / "tests" / "fixtures" / "user_code" / "crashy"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "script-crash", "parallelism": {"dp_replicate": 3},
        "resources": {"device": "cpu", "cpus_per_worker": 0.5},  # this server has 2 CPUs
        "fault_tolerance": {"max_failures": 0},
        "entrypoint": {"command": ["python", "train.py"],
                       "env": {"CRASH_RANK": "1", "CRASH_STEP": "60"}}}))
    out = subprocess.run([*_meshyard(), "submit", str(spec), "--working-dir", str(code),
                          "--url", server.url, "--token", server.token, "--json"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    import json

    job_id = json.loads(out.stdout)["id"]
    page.goto(f"/jobs/{job_id}")
    page.wait_for_function("() => document.getElementById('job-state').textContent "
                           "=== 'FAILED'", timeout=RUN_MS)
    assert page.locator("#job-message").inner_text().startswith("ValueError at train.py:")
    page.locator("#rank-1.culprit").wait_for()
    page.locator("#rank-0 td", has_text="peer lost").wait_for()
    assert page.locator("#rank-2 td").nth(9).inner_text() == "peer lost"
    assert page.locator("#rank-1 td").nth(9).inner_text() == "FAILED"
    assert page.locator("#rank-body tr.bad").count() == 1  # only the rank that raised
    steps = [page.locator(f"#rank-{r} td").nth(6).inner_text() for r in range(3)]
    assert all(re.fullmatch(r"\d+ coll\.", s) and int(s.split()[0]) > 0 for s in steps), steps
    page.locator("#chart-none").wait_for()
    assert page.locator("#charts-grid").is_hidden()
    page.locator("#comm-body td", has_text="runs its own code").wait_for()
    assert page.errors == []


def readme_shot(page: Any, path: Path) -> None:
    """The top of the job page (header with the condition, the diagnosis) 1280 wide,
    quantised to a small PNG for the README."""
    from io import BytesIO

    from PIL import Image

    page.set_viewport_size(DESKTOP)
    page.evaluate("window.scrollTo(0, 0)")
    raw = page.screenshot(clip={"x": 0, "y": 0, "width": 1280, "height": 940}, full_page=True)
    image = Image.open(BytesIO(raw)).convert("RGB").quantize(colors=48, dither=Image.Dither.NONE)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)
