"""The plans `parallelism: auto` can choose run on the real workers: the top plans for a tiny
GPT on a simulated 4-GPU NVSwitch node, each resolved to a spec, run 2 steps in one 4-rank
launch on CPU (gloo), its ranks forked from one process that imported torch once
(tests/integration/workers/forkrun.py). A plan the workers refuse fails the launch. The same launch
runs the planned MoE variant: its top plan and the best plan at each expert-parallel degree
(ep = 1, 2, 4)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.planner.autoplan import request_from_spec, resolved_data
from orchestrator.planner.planner import plan
from orchestrator.spec import parse_spec
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology
from tests.integration.workers.launch_helpers import forkrun

TINY = {"name": "auto-tiny", "parallelism": {"auto": True, "auto_global_batch": 16},
        "model": {"n_layers": 4, "n_heads": 4, "d_model": 64, "vocab_size": 128, "seq_len": 32},
        "training": {"steps": 2, "micro_batch_size": 4, "lr": 3e-3},
        "checkpoint": {"enabled": False}}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_top_auto_plans_train_on_the_workers(tmp_path: Path) -> None:
    node = ClusterNode(name="n0", topology=NodeTopology.uniform(4, "NV18"))
    cluster = ClusterTopology(levels=(), nodes=(node,))
    spec = parse_spec(TINY)
    req = request_from_spec(spec, cluster=cluster)
    result = plan(cluster, req)
    # a spread of layouts: the best plan plus the best of each family
    picks, seen = [], set()
    every = plan(cluster, replace(req, top_k=10_000, solve_top=0)).plans
    for p in (*result.plans[:1], *every):
        c = p.config
        fam = (c.tp, c.pp, c.zero_stage >= 2, c.virtual_stages > 1, c.activation_checkpointing)
        if fam not in seen:
            seen.add(fam)
            picks.append(p)
    assert len(picks) >= 8
    for has in (lambda c: c.pp > 1, lambda c: c.tp > 1, lambda c: c.virtual_stages > 1,
                lambda c: c.activation_checkpointing, lambda c: c.zero_stage >= 2):
        assert any(has(p.config) for p in picks)
    moe = parse_spec({**TINY, "name": "auto-moe", "model": {
        **TINY["model"], "moe": {"experts": 4, "top_k": 2}}})
    moe_req = request_from_spec(moe, cluster=cluster)
    moe_all = plan(cluster, replace(moe_req, top_k=10_000, solve_top=0)).plans
    moe_picks = [plan(cluster, moe_req).plans[0],
                 *(next(p for p in moe_all if p.config.ep == ep) for ep in (1, 2, 4))]
    assert {p.config.ep for p in moe_picks} == {1, 2, 4}
    paths = []
    runs = [*((spec, req, p) for p in picks), *((moe, moe_req, p) for p in moe_picks)]
    for i, (s, r, p) in enumerate(runs):
        data = resolved_data(s, p, global_batch=r.global_batch)
        data["resources"] |= {"device": "cpu"}
        resolved = parse_spec(data)
        assert resolved.world_size == 4
        path = tmp_path / f"plan{i}.json"
        path.write_text(json.dumps(data))
        paths.append(path)
    out = forkrun(nproc=4, specs=paths, out=tmp_path / "run", timeout=380)
    assert out.returncode == 0, (out.stderr[-4000:],
                                 [p.config.label() for p in (*picks, *moe_picks)])
    for path in paths:
        lines = (tmp_path / "run" / path.stem / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2, path.stem
