"""Reading the dashboard with real jobs (a `meshyard serve` that runs them on local Ray, gloo on
CPU; one served runtime for the module): a script job submitted from the submit page with its
code files, its header (start, duration, who cancelled it, nothing stale after CANCELLED), its
stacks (user frames first, wrapper frames folded, nothing cut), its logs (timestamps,
highlighted matches, the first traceback); the jobs list's start column and hung filter; the
cluster page's CPU reservations, a node Ray lost, cordon / uncordon; a built-in job's
checkpoint downloaded as a tar and its charts read with the keyboard; a failure naming a long
path on a phone; the skip link; axe-core on the pages shown.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.axe import axe_violations, describe
from tests.e2e.conftest import DESKTOP, PHONE, Server, run_server, shoot

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
RUN_MS = 150_000  # a CPU job's ranks import torch first: long on a busy 2-core machine

TINY = {"kind": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 32, "vocab_size": 64,
        "seq_len": 16}

# A script that logs a caught traceback (naming a long path), then runs all_reduces forever,
# sleeping 0.2 s after each: a rank's stacks are nearly always in that sleep, and two ranks
# caught in the same place group as one. A rank caught waiting in the all_reduce for its
# peer (a loaded host skews them) stands in torch's frames, a group of its own: the test
# takes the stacks again then.
SCRIPT = textwrap.dedent('''\
    import time
    import traceback

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        open("/no/such/dir/" + "shard-" * 40 + ".bin")
    except OSError:
        traceback.print_exc()
    print(f"rank {rank} warmed up", flush=True)
    t = torch.ones(4)
    step = 0
    while True:
        step += 1
        dist.all_reduce(t)
        time.sleep(0.2)
        if step % 20 == 0:
            print(f"rank {rank} all_reduce {step}", flush=True)
''')
# One rank that fails naming a path with no place to break it.
FAILING = 'raise FileNotFoundError(2, "No such file", "/data/" + "x" * 240 + "/shard.bin")\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tmp_path_factory.mktemp("meshyard-e2e-read"), scheduler=True,
                    extra_args=("--allow-fault-injection",),
                    extra_env={"MESHYARD_USAGE_INTERVAL_S": "1",
                               "MESHYARD_NODE_USAGE_INTERVAL_S": "2",
                               "MESHYARD_WARM_POOL_USER_CODE": "0"}) as s:
        yield s


def state_is(page: Any, state: str, timeout: int = RUN_MS) -> None:
    page.wait_for_function(f"() => document.getElementById('job-state').textContent "
                           f"=== '{state}'", timeout=timeout)


def no_axe(page: Any, where: str) -> None:
    found = axe_violations(page)
    assert not found, f"{where}:\n{describe(found)}"


def test_script_job_from_the_submit_page_reads_right(page: Any, server: Server,
                                                     tmp_path: Path,
                                                     artifacts_dir: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    (code / "helper.txt").write_text("shipped along\n")
    page.goto("/submit")
    page.set_input_files("#code-files", [str(code / "train.py"), str(code / "helper.txt")])
    page.locator("#code-summary", has_text="2 file(s)").wait_for()
    page.fill("#spec-text", textwrap.dedent("""\
        name: ui-script
        parallelism: {dp_replicate: 2}
        resources: {device: cpu, cpus_per_worker: 0.5}
        fault_tolerance: {max_failures: 0}
        entrypoint:
          command: [python, train.py]
        """))
    no_axe(page, "/submit")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r".*/jobs/job-[0-9a-f]+$"), timeout=30_000)
    job_id = page.url.rsplit("/", 1)[1]
    record = server.store.get_job(job_id)
    assert record is not None
    working_dir = record.spec.entrypoint.working_dir  # type: ignore[union-attr]
    assert working_dir is not None and working_dir.startswith("package:sha256:")

    # The header: submitted and started, a running duration.
    state_is(page, "RUNNING")
    page.wait_for_function("() => document.getElementById('job-started').textContent "
                           "!== 'not yet'")
    assert "since it started" in page.locator("#job-duration").inner_text()
    assert page.locator("#job-cancelled-by-fact").is_hidden()

    # Logs: each line with its time; the searched text highlighted; the first traceback.
    logs = page.locator("#log-tail")
    logs.filter(has_text="all_reduce 20").wait_for(timeout=60_000)
    stamp = page.locator("#log-tail .log-ts").first.inner_text()
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", stamp), stamp
    page.fill("#log-search", "warmed up")
    page.locator("#log-tail mark", has_text="warmed up").first.wait_for()
    assert page.locator("#log-tail mark").count() == 2  # one line per rank
    page.fill("#log-search", "")
    logs.filter(has_text="all_reduce").first.wait_for()
    page.click("#log-traceback")
    target = page.locator("#log-tail .log-line.target")
    target.wait_for()
    assert "Traceback (most recent call last)" in target.inner_text()

    # Stacks now: one group for both ranks, led by the script's own frame; the frames that
    # only start a rank folded; the box grows to hold every frame.
    group = page.locator("#stacks-groups details.stack.training").first
    taken = []
    for _ in range(6):  # each take a second apart, so its "taken" time differs
        if taken:
            page.wait_for_timeout(1_100)
        page.click("#stacks-btn")
        page.wait_for_function(
            "prev => { const t = document.getElementById('stacks-meta').textContent; "
            "return t.includes('from 2 rank(s)') && t !== prev; }",
            arg=taken[-1] if taken else "", timeout=60_000)
        taken.append(page.locator("#stacks-meta").inner_text())
        if group.get_attribute("data-ranks") == "0,1":
            break
    assert group.get_attribute("data-ranks") == "0,1", taken
    assert re.search(r"at train\.py:\d+ in <module>\(\)", group.locator("summary").first
                     .inner_text())
    frames = group.locator(".frames")
    wrappers = frames.locator("details.wrappers")
    assert wrappers.count() >= 1 and not wrappers.first.evaluate("d => d.open")
    assert re.search(r"\d+ wrapper frames? \(.*runpy", wrappers.first.inner_text())
    assert frames.locator(".frame.user").count() >= 1
    assert frames.locator("> .frame.wrapper").count() == 0  # every wrapper frame is folded
    assert frames.evaluate("n => n.scrollHeight <= n.clientHeight + 1")  # nothing cut
    wrappers.first.locator("summary").click()
    assert wrappers.first.locator(".frame.wrapper").first.is_visible()
    # py-spy (a test dependency) gives each rank's native stacks, the script's line among them
    native = page.locator("#stacks-groups details.stack.native")
    assert native.count() >= 1
    assert sorted(int(r) for i in range(native.count())
                  for r in native.nth(i).get_attribute("data-ranks").split(",")) == [0, 1]
    native.first.locator("summary").click()
    assert "train.py" in native.first.locator("pre").inner_text()
    shoot(page, artifacts_dir, "reading-stacks")
    no_axe(page, "job page")

    # The jobs list: the start column, and the hung filter leaves this healthy job out.
    page.goto("/")
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    row.wait_for()
    assert row.locator("td.started").inner_text() not in ("", "—")
    page.select_option("#f-state", "hung")
    page.locator("#jobs-empty").wait_for(state="visible")
    assert page.url.endswith("/?state=hung")

    # The cluster page while it runs: the CPUs its ranks reserved, and who holds them.
    page.goto("/cluster")
    page.locator("#gpu-summary", has_text="CPUs reserved").wait_for()
    assert re.search(r"[1-9][\d.]* of [\d.]+ CPUs reserved", page.locator("#gpu-summary")
                     .inner_text())
    holder = page.locator('#nodes-body [data-col="holders"] .holder', has_text="ui-script")
    holder.wait_for()
    assert re.search(r"ui-script: 1 CPU · rank 0[–-]1", holder.inner_text()), \
        holder.inner_text()
    assert "of" in page.locator('#nodes-body [data-col="cpus"]').first.inner_text()

    # Cancel from the header: who cancelled it, and no stale "cancel requested" after.
    page.goto(f"/jobs/{job_id}")
    state_is(page, "RUNNING", timeout=10_000)
    page.click("#cancel-btn")
    page.click("#cancel-btn")
    page.locator("#action-status", has_text="cancel requested").wait_for()
    state_is(page, "CANCELLED")
    page.locator("#job-cancelled-by", has_text="admin").wait_for()
    page.wait_for_function("() => document.getElementById('action-status').textContent "
                           "=== ''")
    assert page.errors == []


def test_a_failure_naming_a_long_path_fits_a_phone(page: Any, server: Server,
                                                   artifacts_dir: Path) -> None:
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("fail.py", FAILING)
    with server.client() as api:
        package = api.post("/v1/packages", content=buf.getvalue(),
                           headers={"Content-Type": "application/zip"}).json()["package"]
        resp = api.post("/v1/jobs", params={"working_dir": package}, json={
            "name": "long-path", "parallelism": {"dp_replicate": 1},
            "resources": {"device": "cpu"}, "fault_tolerance": {"max_failures": 0},
            "entrypoint": {"command": ["python", "fail.py"]}})
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
    page.goto(f"/jobs/{job_id}")
    state_is(page, "FAILED")
    page.locator("#job-message", has_text="x" * 100).wait_for()
    shoot(page, artifacts_dir, "reading-long-path-job")  # asserts no sideways scroll
    page.goto("/?name=long-path")
    page.locator(f'tr[data-job-id="{job_id}"] td.status', has_text="FileNotFoundError").wait_for()
    shoot(page, artifacts_dir, "reading-long-path-list")
    page.set_viewport_size(PHONE)
    page.goto(f"/jobs/{job_id}")
    page.locator("#job-message", has_text="x" * 100).wait_for()
    no_axe(page, "job page on a phone")
    # The skip link is the first thing the keyboard reaches, and moves focus to the content.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip-link"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.set_viewport_size(DESKTOP)
    assert page.errors == []


def test_builtin_checkpoint_downloads_and_charts_read_with_the_keyboard(
        page: Any, server: Server) -> None:
    with server.client() as api:
        resp = api.post("/v1/jobs", json={
            "name": "ckpt-read", "parallelism": {"dp_replicate": 2},
            "resources": {"cpus_per_worker": 0.25}, "model": dict(TINY),
            "training": {"steps": 100, "micro_batch_size": 2, "lr": 0.01}})
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
    page.goto(f"/jobs/{job_id}")
    state_is(page, "SUCCEEDED")
    link = page.locator('#ckpt-body tr[data-step="100"] a.ckpt-download')
    link.wait_for()
    with page.expect_download() as dl:
        link.click()
    assert dl.value.suggested_filename == f"{job_id}-step100.tar"
    with tarfile.open(dl.value.path()) as tar:
        names = tar.getnames()
    assert names and all(n.startswith(f"{job_id}-step100/") for n in names)
    assert any(n.endswith(".metadata") for n in names), names

    # The loss chart: focus shows the last point; the arrow keys walk back, Home the first.
    page.wait_for_function("() => Number(document.querySelector('#chart-loss svg')"
                           "?.dataset.points) === 100")
    chart = page.locator("#chart-loss svg")
    chart.focus()
    page.wait_for_function("() => (document.querySelector('#chart-loss svg').dataset.readout "
                           "|| '').startsWith('step 100')")
    page.keyboard.press("ArrowLeft")
    assert chart.get_attribute("data-readout").startswith("step 99")
    page.keyboard.press("Home")
    assert chart.get_attribute("data-readout").startswith("step 1 ")
    spoken = page.locator("#chart-loss .sr-only")
    assert spoken.inner_text().startswith("step 1,")

    # "Resume from this" on the step-50 checkpoint: the submit form holds the job's spec set
    # to start there; the new job trains steps 51-100 only.
    page.locator('#ckpt-body tr[data-step="50"] a.ckpt-resume').click()
    page.wait_for_url("**/submit?**")
    page.wait_for_function("() => document.getElementById('spec-text').value"
                           ".includes('resume_from')")
    spec = json.loads(page.locator("#spec-text").input_value())
    assert spec["checkpoint"]["resume_from"] == {"job": job_id, "step": 50}
    page.click("#submit-btn")
    page.wait_for_url("**/jobs/job-*")
    resumed = page.url.rsplit("/", 1)[1]
    assert resumed != job_id
    state_is(page, "SUCCEEDED")
    with server.client() as api:
        steps = {m["step"] for m in api.get(f"/v1/jobs/{resumed}/metrics",
                                            params={"limit": 1000}).json()["items"]}
    assert min(steps) == 51 and max(steps) == 100, sorted(steps)[:5]
    assert page.errors == []


def test_cluster_shows_a_lost_node_and_admins_cordon_from_it(page: Any, server: Server) -> None:
    # A node Ray no longer has: the runtime's next look at the cluster marks it lost.
    server.store.upsert_node(name="ghost-node", node_id="f" * 56, alive=True, cpus=4.0)
    page.goto("/cluster")
    ghost = page.locator("#node-ghost-node")
    ghost.locator('[data-col="status"]', has_text="lost").wait_for(timeout=30_000)
    assert ghost.locator(".badge").first.inner_text() == "lost"
    assert "healthy" not in ghost.locator('[data-col="health"]').inner_text()
    assert ghost.locator("button.cordon").count() == 0
    live = page.locator("#nodes-body tr:not(.dead)").first
    name = live.get_attribute("data-node")
    button = live.locator("button.cordon")
    assert button.inner_text() == "Cordon"
    button.click()
    assert live.locator("button.cordon").inner_text() == "Confirm cordon"
    live.locator("button.cordon").click()
    live.locator(".badge", has_text="cordoned").wait_for()
    assert (server.store.get_node_health(name) or None) is not None
    no_axe(page, "cluster page")
    live.locator("button.cordon", has_text="Uncordon").click()
    live.locator("button.cordon", has_text="Confirm uncordon").click()
    live.locator(".badge", has_text="healthy").wait_for()
    page.locator("#cordon-status", has_text="uncordoned").wait_for()
    assert page.errors == []


def test_the_list_filters_a_real_hang(page: Any, server: Server) -> None:
    spec = {"name": "read-hang", "parallelism": {"dp_replicate": 3},
            "resources": {"cpus_per_worker": 0.25}, "model": dict(TINY),
            "training": {"steps": 8, "micro_batch_size": 2, "lr": 0.01},
            "checkpoint": {"enabled": False},
            "fault_tolerance": {"max_failures": 0, "init_timeout_s": 60,
                                "collective_timeout_s": 30},
            "watchdog": {"stall_timeout_s": 3, "first_step_timeout_s": 120,
                         "action": "observe"},
            "inject_fault": {"kind": "hang", "rank": 1, "step": 3}}
    with server.client() as api:
        resp = api.post("/v1/jobs", json=spec)
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
    deadline = time.monotonic() + RUN_MS / 1000
    while not server.store.list_diagnoses(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    page.goto("/?state=hung")
    page.locator(f'tr[data-job-id="{job_id}"]').wait_for()
    assert page.locator("#f-state").input_value() == "hung"
    assert page.locator("#jobs-body tr").count() == 1
    page.select_option("#f-state", "straggling")
    page.locator(f'tr[data-job-id="{job_id}"]').wait_for(state="detached")
    with server.client() as api:
        api.post(f"/v1/jobs/{job_id}/cancel")
    assert page.errors == []
