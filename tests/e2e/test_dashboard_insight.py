"""The job page in real headless Chromium against a real `meshyard serve`, for what a person
reads while a job runs or hangs: the condition an open diagnosis puts on the job (list,
header, ranks), the evidence and placement views, charts, utilisation, checkpoints, logs.

Job states and telemetry are written through the Store on the server's SQLite file (the
scheduler is off), exactly the rows the runtime writes.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.lifecycle import JobState
from orchestrator.mesh import MeshShape
from orchestrator.topology.nvidia_smi import parse_topo_matrix
from orchestrator.topology.serialize import node_topology_to_dict
from orchestrator.watchdog.report import DiagnosisReport, RankReport, Verdict
from tests.e2e.conftest import PHONE, Server, shoot
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
REPO = Path(__file__).resolve().parents[2]
CLOCK = r"\d{2}:\d{2}:\d{2}"


@pytest.fixture(scope="module")
def nodes(server: Server) -> list[str]:
    names = seed_cluster(server.store)
    # The usual Ray layout: a CPU-only head without topology labels next to the GPU nodes.
    server.store.upsert_node(name="ray-head", labels={}, gpus=0, cpus=8.0, topology={})
    return names


def running(server: Server, nodes: list[str], name: str, *, dp: int = 8, tp: int = 1,
            step: int = 12, extra: dict[str, float] | None = None) -> tuple[Any, int]:
    job = submit(server.store, spec_doc(name, dp_replicate=dp, tp=tp, steps=100))
    walk(server.store, job.id, S.PLACING, S.STARTING, S.RUNNING)
    attempt = place(server.store, job, nodes, step=step)
    add_training(server.store, job, attempt, steps=step, ranks=1, extra=extra)
    return job, attempt


def test_open_diagnosis_marks_the_job_everywhere_until_progress_resumes(
        page: Any, server: Server, nodes: list[str], artifacts_dir: Path) -> None:
    job, attempt = running(server, nodes[4:5], "cond-dp8")
    report = hang_report(world=8, culprit=5, mesh=MeshShape(dp_replicate=8), nodes=nodes[4:5])
    page.locator(f'tr[data-job-id="{job.id}"]').wait_for()
    open_condition(server.store, job, attempt, report)
    cell = page.locator(f'tr[data-job-id="{job.id}"] td.status')
    page.wait_for_function("id => document.querySelector(`tr[data-job-id='${id}'] .cond-chip`)",
                           arg=job.id, timeout=5000)  # the next poll (every 2 s)
    assert re.fullmatch(rf"hung since {CLOCK} — rank 5 never entered all_reduce #7",
                        (cell.text_content() or "").strip()), cell.text_content()
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}) \
            as api:
        body = api.get(f"/v1/jobs/{job.id}").json()
        assert body["condition"]["culprit_ranks"] == [5]
        assert body["status"] == body["condition"]["text"]
        ranks = {r["rank"]: r["condition"] for r in api.get(f"/v1/jobs/{job.id}/ranks").json()
                 ["items"]}
        metrics = api.get("/metrics").text
    assert ranks[5] == {"state": "not_joined", "collective": "all_reduce #7"}
    assert ranks[0] == {"state": "waiting", "collective": "all_reduce #7"}
    assert f'job_id="{job.id}"' in metrics and 'condition="hung"' in metrics

    page.goto(f"/jobs/{job.id}")
    banner = page.locator("#condition")
    banner.wait_for(state="visible")
    # The server's first paint names UTC; the page's own redraw uses the browser's clock.
    assert re.search(rf"since {CLOCK}( UTC)? — rank 5 never entered", banner.inner_text())
    page.locator("#rank-5.culprit").wait_for()
    assert page.locator("#rank-5 td").nth(9).inner_text() == "not_joined · all_reduce #7"
    assert page.locator("#rank-2 td").nth(9).inner_text() == "waiting · all_reduce #7"
    assert page.locator("#job-message").inner_text() == "no progress since step 12 of 100"
    assert page.locator("#diag-title").inner_text() == "Hang: a rank never joined the collective"
    shoot(page, artifacts_dir, "condition-job")

    # Progress resumes: the poller clears the condition and the page follows.
    server.store.set_condition(job.id, None)
    add_training(server.store, job, attempt, steps=14, ranks=1)
    banner.wait_for(state="hidden")
    assert page.locator("#job-message").inner_text().startswith("training: step ")
    page.wait_for_function("() => !document.querySelector('#rank-5').classList.contains("
                           "'cond-not_joined')")
    assert page.errors == []


def test_evidence_marks_pending_groups_only_and_names_them_by_dimension(
        page: Any, server: Server, nodes: list[str]) -> None:
    job, attempt = running(server, nodes[5:6], "evidence-dims", dp=4, tp=2)
    from orchestrator.watchdog.report import PgProgress

    evidence = []
    for r in range(8):
        late = r == 1
        pgs = (PgProgress(pg="0", name="default", last_enqueued=14 if late else 15,
                          last_completed=14, pending_op=None if late else "all_reduce #15",
                          missing_op="all_reduce #15" if late else None),
               PgProgress(pg=str(1 + r // 2), name="tp", last_enqueued=0, last_completed=None),
               PgProgress(pg=str(5 + r % 2), name="dp_replicate", last_enqueued=3,
                          last_completed=3))
        evidence.append(RankReport(rank=r, state="not_joined" if late else "waiting", step=14,
                                   pgs=pgs))
    report = DiagnosisReport(verdict=Verdict.NOT_JOINED, culprit_ranks=(1,), confidence=0.9,
                             summary="Rank 1 never entered all_reduce #15.",
                             evidence=tuple(evidence))
    open_condition(server.store, job, attempt, report)
    page.goto(f"/jobs/{job.id}")
    culprit = page.locator('#diag-evidence tr[data-rank="1"] .pg')
    culprit.first.wait_for()
    assert culprit.first.inner_text() == "default: 14 / 14 — never entered all_reduce #15"
    assert "behind" in (culprit.first.get_attribute("class") or "")
    peer = page.locator('#diag-evidence tr[data-rank="4"] .pg')
    assert peer.first.inner_text() == "default: 15 / 14 — waiting in all_reduce #15"
    assert "stuck" in (peer.first.get_attribute("class") or "")
    idle = page.locator('#diag-evidence .pg[data-dim="tp"]')
    assert idle.count() == 8 and all("idle" in (idle.nth(i).get_attribute("class") or "")
                                     for i in range(8))
    assert page.locator('#diag-evidence .pg.stuck[data-dim="dp_replicate"]').count() == 0
    assert page.errors == []


def test_placement_click_and_enter_filter_by_rank_palette_and_nvlink(
        page: Any, server: Server, nodes: list[str], artifacts_dir: Path) -> None:
    topo = parse_topo_matrix((REPO / "tests/fixtures/topo/"
                              "topo_dgx1_v100_hybrid_cube_mesh_nv1_nv2.txt").read_text())
    server.store.upsert_node(name="dgx1", labels={"leaf": "leaf-c", "spine": "spine-0"}, gpus=8,
                             cpus=80.0, topology=node_topology_to_dict(topo))
    job, attempt = running(server, ["dgx1"], "dgx1-tp2", dp=4, tp=2)
    open_condition(server.store, job, attempt,
                   hang_report(world=8, culprit=3, mesh=MeshShape(tp=2, dp_replicate=4),
                               nodes=["dgx1"]))
    page.goto(f"/jobs/{job.id}")
    page.locator('.pm-gpu[data-rank="7"]').wait_for()
    page.click('.pm-gpu[data-rank="1"]')
    page.wait_for_function("() => document.getElementById('rank-count').textContent "
                           "=== '1 of 8 ranks'")  # not ranks 1 and every rank on "dgx1"
    assert page.locator("#rank-1").is_visible() and page.locator("#rank-0").is_hidden()
    page.focus('.pm-gpu[data-rank="6"]')
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.getElementById('rank-filter').value === '6'")
    # No TP group is filled in a red hue: red is the culprit's ring alone.
    hues = page.evaluate("""() => [...document.querySelectorAll('.pm-gpu.used .pm-cell')]
        .map(r => Number(/hsl\\((\\d+(?:\\.\\d+)?)/.exec(r.getAttribute('fill'))[1]))""")
    assert len(hues) == 8 and all(40 <= h <= 300 for h in hues), hues
    assert page.locator(".pm-gpu.culprit .pm-culprit-ring").count() == 1
    # DGX-1's 16 NVLinks: hidden until a GPU is hovered or focused, then only its own.
    page.focus("#rank-filter")
    page.mouse.move(1, 1)
    assert page.locator(".pm-arc").count() == 16
    assert page.locator(".pm-arc.on").count() == 0
    page.focus('.pm-gpu[data-rank="0"]')
    on = page.locator(".pm-arc.on")
    assert on.count() == 4
    assert sorted(on.nth(i).get_attribute("data-pair") for i in range(4)) == \
        ["0-1", "0-2", "0-3", "0-4"]
    page.focus("#rank-filter")
    page.hover('.pm-gpu[data-rank="5"]')
    assert page.locator(".pm-arc.on").count() == 4
    shoot(page, artifacts_dir, "placement-dgx1")
    assert page.errors == []


def test_crash_diagnosis_is_titled_by_its_class(page: Any, server: Server,
                                                nodes: list[str]) -> None:
    job, attempt = running(server, nodes[6:7], "crashed", dp=2)
    report = DiagnosisReport(verdict=Verdict.RANK_EXITED, culprit_ranks=(1,), confidence=0.9,
                             summary="Rank 1 exited (worker process died).",
                             evidence=(RankReport(rank=0, state="waiting"),
                                       RankReport(rank=1, state="exited")))
    server.store.add_diagnosis(job.id, attempt, verdict="RANK_EXITED", culprit_ranks=[1],
                               summary=report.summary, report=report.to_dict())
    page.goto(f"/jobs/{job.id}")
    page.locator("#diagnosis").wait_for(state="visible")
    assert page.locator("#diag-title").inner_text() == "Crash: a rank exited"
    assert page.locator("#jump-diagnosis").is_visible()
    assert page.errors == []


def test_estimate_plan_units_and_pending_sentence(page: Any, server: Server,
                                                  nodes: list[str]) -> None:
    job, _ = running(server, nodes[7:8], "estimate", dp=8)
    page.goto(f"/jobs/{job.id}")
    # A CPU-only, unlabelled head node is in the cluster: the estimate still appears.
    page.locator("#comm-note", has_text="Estimated per step").wait_for()
    planned = submit(server.store, spec_doc("planned-small", dp_replicate=2))
    server.store.add_event(planned.id, kind="info", reason="PLANNED", message="auto plan",
                           data={"plan": {"label": "dp2", "step_s": 5.473e-06,
                                          "compute_s": 3.1e-06, "bubble": 0.0,
                                          "comm_exposed_s": 2.2e-07,
                                          "memory": {"total_gb": 0.0004, "params_gb": 0.0001,
                                                     "grads_gb": 0.0001,
                                                     "optimizer_gb": 0.0002,
                                                     "activations_gb": 0.00002}},
                                 "table": "dp2  ..."})
    server.store.set_pending_reason(planned.id, {
        "kind": "infeasible", "message": "the job needs 8 GPUs but the cluster has 4",
        "reason": "INFEASIBLE", "needed_gpus": 8, "free_gpus": 0, "total_gpus": 4,
        "retryable": False})
    page.goto(f"/jobs/{planned.id}")
    assert page.locator("#plan-step").inner_text() == "5 µs"
    assert page.locator("#plan-memory").inner_text().startswith("400 KB (params 100 KB")
    assert "GB" not in page.locator("#plan-memory").inner_text()
    page.locator("#pending").wait_for(state="visible")
    assert page.locator("#pending-text").inner_text() == \
        "the job needs 8 GPUs but the cluster has 4"
    assert page.errors == []


def test_charts_readout_integer_steps_log_scale_wall_clock_lr_and_grad_norm(
        page: Any, server: Server, nodes: list[str], artifacts_dir: Path) -> None:
    job, attempt = running(server, nodes[0:1], "charts", dp=2, step=7)
    page.goto(f"/jobs/{job.id}")
    page.wait_for_function("() => Number(document.querySelector('#chart-loss svg')"
                           "?.dataset.points) === 7")
    ticks = page.locator("#chart-loss .x-tick").all_text_contents()
    assert ticks and all(t.isdigit() for t in ticks), ticks  # 7 steps: no "1.5"
    for chart in ("#chart-lr", "#chart-grad", "#chart-tput"):
        assert page.locator(f"{chart} svg").get_attribute("data-points") == "7"
    # A job without gradient compression or MoE shows no chart for them.
    for fig in ("#fig-comm", "#fig-ratio", "#fig-aux"):
        assert page.locator(fig).is_hidden()
    box = page.locator("#chart-loss svg .hit").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    readout = page.locator("#chart-loss svg").get_attribute("data-readout") or ""
    assert re.fullmatch(r"step [3-5] \| \d\.\d+", readout), readout
    assert page.locator("#chart-loss .readout").get_attribute("visibility") == "visible"
    page.check("#chart-log")
    assert page.locator("#chart-loss svg").get_attribute("data-scale") == "log"
    page.select_option("#chart-x", "time")
    assert page.locator("#chart-loss svg").get_attribute("data-x") == "time"
    assert all(re.fullmatch(r"\d{2}:\d{2}(:\d{2})?", t)
               for t in page.locator("#chart-loss .x-tick").all_text_contents())
    # Chart text stays legible on a phone: the chart is drawn at the screen's width.
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(400)
    size = page.evaluate("() => document.querySelector('#chart-loss .x-tick')"
                         ".getBoundingClientRect().height")
    assert size >= 10, size
    shoot(page, artifacts_dir, "charts")
    assert page.errors == []


def test_compression_and_moe_charts_show_when_the_job_reports_them(
        page: Any, server: Server, nodes: list[str]) -> None:
    job, _ = running(server, nodes[2:3], "topk-moe", dp=2, step=6, extra={
        "grad_comm_bytes": 69_000, "grad_compression_ratio": 49.9, "moe_aux_loss": 1.02})
    page.goto(f"/jobs/{job.id}")
    page.wait_for_function("() => Number(document.querySelector('#chart-comm svg')"
                           "?.dataset.points) === 6")
    for fig, chart in (("#fig-comm", "#chart-comm"), ("#fig-ratio", "#chart-ratio"),
                       ("#fig-aux", "#chart-aux")):
        assert page.locator(fig).is_visible()
        assert page.locator(f"{chart} svg").get_attribute("data-points") == "6"
    assert "67.4 KiB" in (page.locator("#chart-comm svg").text_content() or "")  # 69,000 B
    assert page.errors == []


def test_utilisation_per_rank_and_node_with_gpus(page: Any, server: Server,
                                                 nodes: list[str]) -> None:
    job, attempt = running(server, nodes[1:2], "usage", dp=4)
    add_usage(server.store, job, attempt, ranks=4, nodes=nodes[1:2])
    add_node_usage(server.store, nodes[1:2])
    page.goto(f"/jobs/{job.id}")
    page.wait_for_function("() => Number(document.querySelector('#chart-cpu svg')"
                           "?.dataset.series) === 4")
    assert page.locator("#fig-gpu").is_visible() and page.locator("#fig-gpumem").is_visible()
    assert page.locator("#chart-gpu svg").get_attribute("data-points") == "80"
    row = page.locator(f'#usage-nodes-body tr[data-node="{nodes[1]}"]')
    row.wait_for()
    assert "GPU 0: 40%" in row.inner_text() and "2.0 TiB" in row.inner_text()
    assert page.locator("#rank-3 td").nth(12).inner_text() == "53%"
    assert page.locator("#rank-3 td").nth(11).inner_text() == "4.0 GiB"
    assert page.errors == []


def test_checkpoints_and_logs_by_attempt_rank_stream_search_paging_and_download(
        page: Any, server: Server, nodes: list[str]) -> None:
    job, first = running(server, nodes[2:3], "logs", dp=2, step=6)
    store = server.store
    store.add_checkpoint(job.id, first, {"step": 2, "path": "/r/step_00000002",
                                         "size_bytes": 3 * 2**20, "time": time.time(),
                                         "kept": [2]})
    store.add_checkpoint(job.id, first, {"step": 4, "path": "/r/step_00000004",
                                         "size_bytes": 3 * 2**20, "time": time.time(),
                                         "kept": [4]})
    store.add_logs(job.id, first, [{"rank": r, "stream": "stdout" if i % 3 else "stderr",
                                    "line": f"a1 r{r} line {i:04d}"}
                                   for i in range(700) for r in range(2)])
    walk(store, job.id, S.RESTARTING, S.STARTING)
    second = place(store, job, nodes[2:3], step=4)
    store.add_logs(job.id, second, [{"rank": 1, "stream": "stdout", "line": "a2 resumed"}])
    page.goto(f"/jobs/{job.id}")
    page.locator('#ckpt-body tr[data-step="4"]').wait_for()
    assert page.locator('#ckpt-body tr[data-step="2"] td').nth(4).inner_text() == "pruned"
    assert page.locator('#ckpt-body tr[data-step="4"] td').nth(3).inner_text() == "3.0 MiB"

    logs = page.locator("#log-tail")
    logs.filter(has_text="a2 resumed").wait_for()
    assert page.locator("#log-attempt").input_value() == "2"
    page.select_option("#log-attempt", "1")
    logs.filter(has_text="a1 r1 line 0699").wait_for()
    assert "line 0449" not in logs.inner_text()  # the newest 500 lines of 1400 first
    page.click("#log-older")
    logs.filter(has_text="a1 r1 line 0449").wait_for()
    assert page.locator("#log-count").inner_text().startswith("1000 line")
    page.select_option("#log-rank", "1")
    page.select_option("#log-stream", "stderr")
    page.wait_for_function("() => document.getElementById('log-tail').textContent"
                           ".split('\\n').every(l => l.startsWith('[1]! '))")
    text = logs.inner_text()
    assert "a1 r1 line 0699" in text
    assert "r0 " not in text and all(line.startswith("[1]! ") for line in text.splitlines())
    page.fill("#log-search", "line 069")
    page.wait_for_function("() => document.getElementById('log-tail').textContent"
                           ".split('\\n').length === 4")  # 0690, 0693, 0696, 0699 (stderr)
    href = page.locator("#log-download").get_attribute("href") or ""
    assert "rank=1" in href and "attempt=1" in href
    page.fill("#log-search", "")
    page.select_option("#log-stream", "")
    href = page.locator("#log-download").get_attribute("href") or ""
    with page.expect_download() as dl:
        page.click("#log-download")
    lines = Path(dl.value.path()).read_text().splitlines()
    assert len(lines) == 700 and lines[0] == "a1 r1 line 0000" and "attempt1-rank1" in \
        dl.value.suggested_filename
    assert page.errors == []


def test_a_late_answer_to_an_earlier_log_filter_never_replaces_the_newer_one(
        page: Any, server: Server, nodes: list[str]) -> None:
    """Rank 1, then at once its stderr: the answer for "rank 1, every stream" is held until
    the stream is chosen and then let through; the tail shows rank 1's stderr and keeps it
    on the polls after, and the page polls in one loop (one job request per tick)."""
    job, attempt = running(server, nodes[2:3], "late-logs", dp=2, step=6)
    server.store.add_logs(job.id, attempt, [{"rank": r, "stream": "stdout" if i % 3 else "stderr",
                                       "line": f"r{r} line {i:03d}"}
                                      for i in range(60) for r in range(2)])
    held: list[Any] = []

    def hold_rank_only(route: Any) -> None:
        q = route.request.url.partition("?")[2]
        if "rank=1" in q and "stream=" not in q and not held:
            held.append(route)
        else:
            route.continue_()

    page.route(re.compile(rf".*/v1/jobs/{job.id}/logs\?.*"), hold_rank_only)
    page.goto(f"/jobs/{job.id}")
    logs = page.locator("#log-tail")
    logs.filter(has_text="r0 line 059").wait_for()
    page.select_option("#log-rank", "1")
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert held, "the page never asked for rank 1's lines"
    page.select_option("#log-stream", "stderr")
    page.wait_for_timeout(300)
    held[0].continue_()  # the older answer arrives after the newer filter was chosen
    only_stderr = ("() => { const t = document.getElementById('log-tail').textContent;"
                   " return t.includes('r1 line 057') && t.split('\\n')"
                   ".every(l => l.startsWith('[1]! ')); }")
    page.wait_for_function(only_stderr)
    job_requests: list[str] = []
    page.on("request", lambda r: job_requests.append(r.url)
            if r.url.endswith(f"/v1/jobs/{job.id}") else None)
    page.wait_for_timeout(4500)  # two more polls at 2 s
    assert page.evaluate(only_stderr)
    assert 1 <= len(job_requests) <= 3, job_requests
    assert page.errors == []
