"""Planning against a cluster snapshot built from Ray-like node records and a declared topology."""

from orchestrator.nodes.health_policy import Cordon
from orchestrator.placement.gang_plan import GangPlan, Pending, plan_job, wait_for_cordons
from orchestrator.placement.holds import busy_gpus, planned_holds
from orchestrator.placement.snapshot import RayNode, build_snapshot
from orchestrator.spec import parse_spec
from orchestrator.topology.declared import parse_cluster_doc

DECLARED = parse_cluster_doc({"levels": ["leaf"], "nodes": [
    {"name": "n1", "gpus": 4, "labels": {"leaf": "l0"}},
    {"name": "n2", "gpus": 4, "labels": {"leaf": "l1"}}]})


def _ray(name: str, *, gpus: int, free_gpus: int, cpus: float = 8, free_cpus: float = 8):
    return RayNode(node_id=f"id-{name}", ip="127.0.0.1", labels={"meshyard.io/node": name},
                   gpus=gpus, cpus=cpus, free_gpus=free_gpus, free_cpus=free_cpus)


def _spec(**parallelism: int) -> object:
    return parse_spec({"name": "t", "parallelism": parallelism,
                       "resources": {"cpus_per_worker": 0.5}})


def test_inventory_joins_by_node_label_and_pads_busy_gpus_from_ray_counts():
    inv = build_snapshot(ray_nodes=[_ray("n1", gpus=4, free_gpus=1), _ray("n2", gpus=4,
                                                                            free_gpus=4)],
                          topology=DECLARED, busy={"id-n1": [0]})
    n1 = inv.cluster.node("n1")
    assert n1.node_id == "id-n1" and n1.labels["leaf"] == "l0"
    assert n1.busy_gpus == {0, 3, 2}  # ours (0) plus two more Ray says are in use
    assert inv.free_gpus == 5


def test_gpu_plan_pins_every_rank_to_a_ray_node():
    inv = build_snapshot(ray_nodes=[_ray("n1", gpus=4, free_gpus=4),
                                     _ray("n2", gpus=4, free_gpus=4)], topology=DECLARED)
    plan = plan_job(_spec(tp=4, dp_replicate=2), inv)
    assert isinstance(plan, GangPlan) and plan.device == "gpu"
    assert [b.rank for b in plan.bundles] == list(range(8))
    assert {b.node_id for b in plan.bundles[:4]} != {b.node_id for b in plan.bundles[4:]}
    assert all(b.resources == {"GPU": 1, "CPU": 0.5} for b in plan.bundles)
    by_id = {k: v for k, v in busy_gpus(planned_holds("j", plan.to_dict())).items()
             if k.startswith("id-")}
    assert by_id == {"id-n1": [0, 1, 2, 3], "id-n2": [0, 1, 2, 3]}


def test_pending_kinds_infeasible_waiting_fragmented():
    inv = build_snapshot(ray_nodes=[_ray("n1", gpus=4, free_gpus=2),
                                     _ray("n2", gpus=4, free_gpus=2)], topology=DECLARED)
    never = plan_job(_spec(dp_replicate=16), inv)
    assert isinstance(never, Pending) and never.kind == "infeasible"
    assert never.to_dict()["needed_gpus"] == 16 and never.to_dict()["total_gpus"] == 8
    waits = plan_job(_spec(dp_replicate=6), inv)
    assert isinstance(waits, Pending) and waits.kind == "waiting"
    frag = plan_job(_spec(tp=4), inv)  # 4 free in total, but 2 + 2 on two nodes
    assert isinstance(frag, Pending) and frag.kind == "fragmented"
    avoided = plan_job(_spec(dp_replicate=2), inv, avoid={"n1", "n2"})
    assert isinstance(avoided, Pending)


def test_cpu_jobs_pack_consecutive_ranks_on_the_roomiest_node():
    nodes = [_ray("a", gpus=0, free_gpus=0, cpus=2, free_cpus=2),
             _ray("b", gpus=0, free_gpus=0, cpus=4, free_cpus=3)]
    inv = build_snapshot(ray_nodes=nodes, topology=None)
    plan = plan_job(_spec(dp_replicate=8), inv)
    assert isinstance(plan, GangPlan) and plan.device == "cpu"
    assert [b.node for b in plan.bundles] == ["b"] * 6 + ["a"] * 2
    assert plan_job(_spec(dp_replicate=13), inv).kind == "infeasible"  # type: ignore[union-attr]
    assert plan_job(_spec(dp_replicate=11), inv).kind == "waiting"  # type: ignore[union-attr]


def test_a_job_that_fits_only_with_cordoned_nodes_waits_for_them():
    # Both nodes cordoned: without them a CPU job never fits; with them it does, so it waits
    # (not infeasible), and is told which nodes, why, and until when.
    inv = build_snapshot(ray_nodes=[_ray("n1", gpus=0, free_gpus=0, cpus=2, free_cpus=2),
                                    _ray("n2", gpus=0, free_gpus=0, cpus=2, free_cpus=2)],
                         topology=None)
    spec = parse_spec({"name": "t", "parallelism": {"dp_replicate": 2},
                       "resources": {"device": "cpu", "cpus_per_worker": 2}})
    cordons = [Cordon("n1", "cordoned by admin: maintenance", 1_800_000_000.0),
               Cordon("n2", "COMM_WEDGED: NET/IB completion error", None)]
    without = plan_job(spec, inv, avoid={"n1", "n2"})
    assert isinstance(without, Pending) and without.kind == "infeasible"
    waits = wait_for_cordons(without, with_cordoned=plan_job(spec, inv), cordons=cordons)
    assert waits.kind == "cordoned"
    assert waits.message.startswith(
        "waiting for cordoned nodes n1 (cordoned by admin: maintenance) until 2027-01-15 "
        "08:00 UTC; n2 (COMM_WEDGED: NET/IB completion error) permanently, until an admin "
        "uncordons it: the job fits the cluster only with them")
    reason = waits.to_dict()
    assert reason["kind"] == "cordoned" and [c["until"] for c in reason["cordoned_nodes"]] == [
        1_800_000_000.0, None]
    # Busy cordoned nodes: the job still only waits for them.
    busy = build_snapshot(ray_nodes=[_ray("n1", gpus=0, free_gpus=0, cpus=2, free_cpus=0),
                                     _ray("n2", gpus=0, free_gpus=0, cpus=2, free_cpus=0)],
                          topology=None)
    assert wait_for_cordons(without, with_cordoned=plan_job(spec, busy),
                            cordons=cordons).kind == "cordoned"
    # A job that never fits even with the cordoned nodes stays infeasible.
    big = parse_spec({"name": "t", "parallelism": {"dp_replicate": 3},
                      "resources": {"device": "cpu", "cpus_per_worker": 2}})
    never = plan_job(big, inv, avoid={"n1", "n2"})
    assert wait_for_cordons(never, with_cordoned=plan_job(big, inv), cordons=cordons) is never
