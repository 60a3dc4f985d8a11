"""`meshyard calibrate`: a real 2-process gloo benchmark over loopback, the alpha-beta fit,
calibration.json, and the cost model using it afterwards (`meshyard plan`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.placement.links import LinkFigures
from orchestrator.planner.calibration.figures import figures_from, load, load_figures
from orchestrator.planner.calibration.fit import Row, bus_factor, fit_alpha_beta

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-c", "from api.cli import main; main()"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, check=False)


def test_fit_recovers_alpha_and_beta_from_exact_model_times() -> None:
    alpha, gbs = 20e-6, 3.0
    rows = []
    for prim in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        n = 2 if prim == "send_recv" else 4
        for nbytes in (64, 4096, 1 << 20, 16 << 20):
            a, b = ((1, 1) if prim == "send_recv"
                    else (2 * (n - 1) if prim == "all_reduce" else n - 1, bus_factor(prim, n)))
            rows.append(Row(prim, n, nbytes, a * alpha + b * nbytes / (gbs * 1e9)))
    fit = fit_alpha_beta(rows)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.gbs == pytest.approx(gbs, rel=1e-6)
    assert fit.rms_rel_error < 1e-9


def test_bus_bandwidth_factors() -> None:
    r = Row("all_reduce", 4, 1_000_000, 1e-3)
    assert r.algbw_gbs == pytest.approx(1.0)
    assert r.busbw_gbs == pytest.approx(1.5)  # 2(n-1)/n
    assert Row("all_gather", 4, 1_000_000, 1e-3).busbw_gbs == pytest.approx(0.75)
    assert Row("send_recv", 2, 1_000_000, 1e-3).busbw_gbs == pytest.approx(1.0)


def test_figures_override_only_measured_classes() -> None:
    f = figures_from({"links": {"pcie": {"alpha_us": 40.0, "gbs": 1.5}}})
    assert (f.pcie4_x16_gbs, f.pcie5_x16_gbs, f.pcie_alpha_us) == (1.5, 1.5, 40.0)
    assert f.nvlink4_gbs == LinkFigures().nvlink4_gbs


@pytest.mark.timeout(400)
def test_calibrate_two_processes_then_plan_uses_the_figures(tmp_path: Path) -> None:
    data = tmp_path / "data"
    plan_args = ("plan", "--layers", "8", "--d-model", "512", "--heads", "8", "--vocab", "1000",
                 "--seq-len", "256", "--gpus", "8", "--global-batch", "16", "--intra-node",
                 "PIX", "--json", "--top", "200", "--data-dir", str(data))
    before = _cli(*plan_args)
    assert before.returncode == 0, before.stderr
    out = _cli("calibrate", "--local", "--nproc", "2", "--max-bytes", "256KiB", "--iters", "3",
               "--link-class", "pcie", "--json", "--data-dir", str(data))
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc == {**load(data), "path": doc["path"]}  # what was printed is what was stored
    prims = {r["primitive"] for r in doc["rows"]}
    assert prims == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    sizes = sorted({r["bytes"] for r in doc["rows"] if r["primitive"] == "all_reduce"})
    assert sizes[0] == 8 and sizes[-1] == 256 << 10 and len(sizes) == 16
    for r in doc["rows"]:
        assert r["time_us"] > 0
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * bus_factor(r["primitive"],
                                                                           r["n"]))
    fit = doc["links"]["pcie"]
    assert fit["rows"] == len(doc["rows"]) and fit["gbs"] > 0 and fit["alpha_us"] >= 0
    figures = load_figures(data)
    assert figures is not None and figures.pcie4_x16_gbs == fit["gbs"]
    after = _cli(*plan_args)
    assert after.returncode == 0, after.stderr
    t0 = {p["label"]: p["comm_total_s"] for p in json.loads(before.stdout)["result"]["plans"]}
    t1 = {p["label"]: p["comm_total_s"] for p in json.loads(after.stdout)["result"]["plans"]}
    # the fitted alpha/beta replace the PCIe defaults, so every communicating plan's estimate
    # moves (which way depends on how alpha and bandwidth came out on this loaded loopback)
    changed = [k for k in t0 if k in t1 and t0[k] > 0]
    assert changed and all(t1[k] != pytest.approx(t0[k], rel=1e-9) for k in changed)
