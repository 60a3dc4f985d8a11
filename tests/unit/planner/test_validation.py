"""The planner against published practice."""

from __future__ import annotations

from orchestrator.planner.memory import KNOWN_MODELS
from orchestrator.planner.planner import Hardware, PlanRequest, plan
from orchestrator.topology.declared import pcie_topology
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology

H100 = Hardware(memory_gb=80, peak_tflops=989)
L40S = Hardware(memory_gb=48, peak_tflops=362)


def dgx_cluster(nodes: int, *, per_leaf: int = 32) -> ClusterTopology:
    return ClusterTopology(levels=("leaf", "spine"), nodes=tuple(
        ClusterNode(name=f"dgx-{i:05d}", topology=NodeTopology.uniform(8, "NV18"),
                    labels={"leaf": f"leaf-{i // per_leaf}", "spine": f"spine-{i // 512}"})
        for i in range(nodes)))


def test_70b_on_nvswitch_nodes_keeps_tp_inside_a_node() -> None:
    res = plan(dgx_cluster(8), PlanRequest(model=KNOWN_MODELS["llama-70b"], global_batch=512,
                                           hardware=H100))
    assert res.plans and res.tp_domain == 8
    assert all(p.config.tp <= 8 for p in res.plans)
    top = res.plans[0]
    tp_rows = [d for d in top.comm if d["dimension"] == "tp"]
    assert top.config.tp > 1 and tp_rows and tp_rows[0]["link"] == "NV18"
    # tp=16 and above are rejected for crossing the node's NVLink domain, with the reason
    assert res.rejected_counts.get("tp_domain", 0) >= 1
    assert any("crosses NVLink domains" in r.message for r in res.rejected)


def test_model_that_fits_one_gpu_prefers_pure_data_parallel() -> None:
    res = plan(dgx_cluster(1), PlanRequest(model=KNOWN_MODELS["gpt2"], global_batch=256,
                                           hardware=H100, top_k=10_000))
    top = res.plans[0]
    assert (top.config.tp, top.config.pp) == (1, 1)
    assert top.config.dp == 8
    # TP plans of the same model were feasible and rank lower: their all-reduces are exposed
    tp_plans = [p for p in res.plans if p.config.tp > 1]
    assert tp_plans and min(p.step_s for p in tp_plans) > top.step_s
    assert min(p.comm_exposed_s for p in tp_plans) > top.comm_exposed_s


def test_405b_on_16384_gpus_needs_pipeline_parallelism() -> None:
    # Llama 3 405B's published setup: 16K H100s in 8-GPU NVSwitch nodes, 16M-token batches
    # of 8,192-token sequences (2,048 sequences).
    res = plan(dgx_cluster(2048), PlanRequest(model=KNOWN_MODELS["llama-405b"],
                                              global_batch=2048, hardware=H100))
    assert res.world_size == 16384
    top = res.plans[0]
    assert top.config.pp > 1
    assert top.config.tp == 8
    assert all(p.config.pp > 1 for p in res.plans[:5])


def test_pcie_only_box_avoids_tp_above_2() -> None:
    box = ClusterTopology(levels=("leaf",), nodes=(
        ClusterNode(name="pcie-box", topology=pcie_topology(8), labels={"leaf": "a"}),))
    for name in ("llama-7b", "gpt2-xl"):
        res = plan(box, PlanRequest(model=KNOWN_MODELS[name], global_batch=64, hardware=L40S))
        assert res.plans, name
        assert all(p.config.tp <= 2 for p in res.plans), [p.config.label() for p in res.plans]
        assert any("no NVLink" in n for n in res.notes)
