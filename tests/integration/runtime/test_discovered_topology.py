"""Without a declared topology file the runtime discovers every GPU node's links (a pinned
discovery task per GPU node) and the scheduler places on them. This machine has no GPU, so
`nvidia-smi` is a stand-in that prints a two-GPU NVLink matrix: a tp=2 job whose TP group must
stay inside one NVLink domain fits only with the discovered links (Ray's fake GPUs alone have
unknown links, 'SYS', where it never fits)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.lifecycle import JobState
from orchestrator.placement.gang_plan import Pending, plan_job
from orchestrator.placement.snapshot import build_snapshot
from orchestrator.runtime.nodes import read_ray_nodes
from orchestrator.runtime.service import Runtime
from orchestrator.settings import Settings
from orchestrator.spec import parse_spec
from tests.integration.runtime.conftest import submit, tiny_spec, wait_state

MATRIX = """\
        GPU0    GPU1    CPU Affinity    NUMA Affinity
GPU0     X      NV4     0-11            0
GPU1    NV4      X      0-11            0

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def _fake_nvidia_smi(tmp: Path) -> Path:
    (tmp / "topo.txt").write_text(MATRIX)
    exe = tmp / "nvidia-smi"
    exe.write_text(f'#!/bin/sh\n[ "$1" = topo ] && exec cat {tmp / "topo.txt"}\nexit 6\n')
    exe.chmod(0o755)
    return exe


def test_discovered_links_feed_the_store_and_the_scheduler(ray_cluster, store, tmp_path):
    spec = tiny_spec("tp-in-nvlink", parallelism={"tp": 2},
                     placement={"tp_within": "nvlink_domain", "mode": "required"})
    settings = Settings(data_dir=tmp_path, ray_address=ray_cluster.address)
    assert settings.cluster_file is None
    rt = Runtime(settings, store, tick_s=0.2,
                 discovery={"nvidia_smi": str(_fake_nvidia_smi(tmp_path)), "ib_root": None,
                            "nvml_module": None})
    rt.start()
    try:
        # Links unknown (no topology): the TP group never fits, whatever is free.
        bare = build_snapshot(ray_nodes=read_ray_nodes(), topology=None)
        pending = plan_job(parse_spec(spec), bare)
        assert isinstance(pending, Pending) and pending.kind == "infeasible", pending
        nodes = {n.name: n for n in store.list_nodes() if n.alive}
        assert {"n1", "n2", "c1"} <= set(nodes)
        for name in ("n1", "n2"):
            links = {(link["a"], link["b"]): link["type"]
                     for link in nodes[name].topology["links"]}
            assert links == {(0, 1): "NV4"}, nodes[name].topology
        assert nodes["c1"].gpus == 0
        job_id = submit(store, spec)
        job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=240)
        assert job.state == JobState.SUCCEEDED, job.message
        (attempt,) = store.list_attempts(job_id)
        assert attempt.placement["solver"]["tp_within"] == "nvlink_domain"
        assert len({b["node"] for b in attempt.placement["bundles"]}) == 1
    finally:
        rt.stop()
