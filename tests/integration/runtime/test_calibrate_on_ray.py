"""`meshyard calibrate` as a Ray job on the simulated cluster: one probe inside a GPU node and
one across the two GPU nodes, gloo over loopback in Ray actors pinned by placement groups;
calibration.json per level; the placement cost model using it; nothing left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table

from orchestrator.placement.links import LinkModel
from orchestrator.placement.snapshot import build_snapshot
from orchestrator.planner.calibration.figures import load, load_figures
from orchestrator.planner.calibration.fit import bus_factor
from orchestrator.planner.calibration.probes import Probe
from orchestrator.runtime.calibrate import CalibrationError, _run_probe
from orchestrator.runtime.nodes import read_ray_nodes
from orchestrator.topology.declared import load_cluster_file

ROOT = Path(__file__).resolve().parents[3]


def _cluster_file(path: Path) -> Path:
    """n1 and n2 (the fixture's GPU nodes) under one spine, different leaf switches."""
    doc = {"levels": ["leaf", "spine"], "nodes": [
        {"name": n, "gpus": 2, "intra_node": "nvswitch", "labels": {"leaf": leaf, "spine": "s0"}}
        for n, leaf in (("n1", "l0"), ("n2", "l1"))]}
    path.write_text(yaml.safe_dump(doc))
    return path


def _live_pgs() -> list[str]:
    return [pg_id for pg_id, pg in placement_group_table().items()
            if pg["state"] not in ("REMOVED",)]


def _no_new_groups(before: set[str], timeout_s: float = 30.0) -> bool:
    """Ray removes placement groups asynchronously: wait (bounded) for the table to agree."""
    deadline = time.monotonic() + timeout_s
    while not set(_live_pgs()) <= before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.timeout(600)
def test_calibrate_every_level_on_ray_then_the_cost_model_uses_it(
        tmp_path: Path, ray_connected: Cluster) -> None:
    ray_cluster = ray_connected
    before = set(_live_pgs())
    cluster_file = _cluster_file(tmp_path / "cluster.yaml")
    data = tmp_path / "data"
    out = subprocess.run(
        [sys.executable, "-c", "from api.cli import main; main()", "calibrate",
         "--ray-address", ray_cluster.address, "--cluster", str(cluster_file),
         "--max-bytes", "64KiB", "--iters", "3", "--cpus-per-rank", "0.25", "--timeout", "300",
         "--json", "--data-dir", str(data)],
        capture_output=True, text=True, cwd=ROOT, timeout=500, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    doc = json.loads(out.stdout)
    assert doc == {**load(data), "path": doc["path"]}
    assert doc["mode"] == "ray" and doc["backend"] == "gloo"  # fake GPUs: gloo on CPU
    # Inside a node: both GPUs of one NVSwitch node, so the class is nvlink. Across nodes:
    # n1 and n2 meet only at the spine (span 2), one rank each, class network.
    node, spine = doc["levels"]["node"], doc["levels"]["spine"]
    assert set(doc["levels"]) == {"node", "spine"}
    assert (node["link_class"], node["span"], node["ranks"], len(node["nodes"])) == (
        "nvlink", 0, 2, 1)
    assert node["nodes"][0] in ("n1", "n2")
    assert (spine["link_class"], spine["span"], spine["nodes"]) == ("network", 2, ["n1", "n2"])
    for lv in (node, spine):
        assert lv["gbs"] > 0 and lv["alpha_us"] >= 0 and lv["rows"] == 4 * 14
    for r in doc["rows"]:
        assert r["time_us"] > 0
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * bus_factor(r["primitive"],
                                                                           r["n"]))
    assert {(r["level"], r["primitive"]) for r in doc["rows"]} == {
        (lv, p) for lv in ("node", "spine")
        for p in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")}
    # The stored figures drive the cost model: a 2-GPU ring inside n1 and the n1-n2 crossing
    # now cost what was measured (the spine figure brought down to the leaf and back up).
    figures = load_figures(data)
    assert figures is not None
    model = LinkModel(load_cluster_file(cluster_file), figures)
    assert model.ring("n1", [0, 1]).gbs == pytest.approx(node["gbs"], rel=1e-9)
    cross = model.network_link(2, rail_aligned=True)
    assert (cross.gbs, cross.alpha_s) == pytest.approx(
        (spine["gbs"], spine["alpha_us"] * 1e-6), rel=1e-9)
    # Every probe's placement group is gone.
    assert _no_new_groups(before), _live_pgs()


@pytest.mark.timeout(300)
def test_a_probe_ray_cannot_place_fails_naming_it_and_cleans_up(
        tmp_path: Path, ray_connected: Cluster) -> None:
    before = set(_live_pgs())
    inv = build_snapshot(ray_nodes=read_ray_nodes(), topology=None)
    # c1 has no GPU: a GPU bundle pinned there can never be reserved.
    probe = Probe("node", 0, ("c1", "c1"), gpu=True)
    with pytest.raises(CalibrationError, match=r"probe node on c1: Ray could not reserve 2 x"):
        _run_probe(inv.cluster, probe, {}, cpus_per_rank=0.25, reserve_timeout_s=3,
                   timeout_s=10)
    assert _no_new_groups(before), _live_pgs()
