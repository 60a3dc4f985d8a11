"""View models behind the server-rendered parts: levels, level tree, GPU usage, comm table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from api.dashboard import views
from api.store_views import cluster_levels
from orchestrator.admission.access import Role
from orchestrator.lifecycle import JobState
from orchestrator.store.records import JobRecord, NodeRecord, RankRecord, UserRecord
from tests.unit.dashboard.seed import spec_doc

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def node(name: str, labels: dict[str, Any], *, gpus: int = 8,
         topology: dict[str, Any] | None = None) -> NodeRecord:
    return NodeRecord(name=name, node_id=None, alive=True, labels=labels, gpus=gpus, cpus=8.0,
                      topology=topology or {}, updated_at=NOW)


def job(name: str, owner: str, spec: dict[str, Any], world: int = 2) -> JobRecord:
    from orchestrator.spec import parse_spec

    return JobRecord(id=f"job-{name}", seq=1, name=name, owner=owner, state=JobState.RUNNING,
                     priority=0, spec_doc=parse_spec(spec).model_dump(mode="json"),
                     submission_id=None, world_size=world, total_steps=10, created_at=NOW,
                     updated_at=NOW)


def rank(job_id: str, r: int, node_name: str | None, gpu: int | None) -> RankRecord:
    return RankRecord(job_id=job_id, attempt=1, rank=r, node=node_name, node_id=None, gpu=gpu,
                      coords={}, state="running", step=1, phase="forward",
                      last_heartbeat=NOW, pid=None)


def test_levels_come_from_labels_finest_first_without_ray_keys() -> None:
    nodes = [node("a", {"leaf": "l0", "spine": "s0", "ray.io/node-id": "x"})]
    assert cluster_levels(nodes) == ("leaf", "spine")
    stored = [node("a", {"leaf": "l0"}, topology={"levels": ["nvlink_domain", "leaf"]})]
    assert cluster_levels(stored) == ("nvlink_domain", "leaf")


def test_level_tree_nests_coarsest_first() -> None:
    nodes = [node("a", {"leaf": "l0", "spine": "s0"}), node("b", {"leaf": "l1", "spine": "s0"}),
             node("c", {"leaf": "l0", "spine": "s0"})]
    tree = views.level_tree(nodes, ("leaf", "spine"))
    (spine,) = tree.children
    assert (spine.level, spine.value) == ("spine", "s0")
    assert [(c.value, c.nodes) for c in spine.children] == [("l0", ["a", "c"]), ("l1", ["b"])]


def test_gpu_usage_names_visible_jobs_and_hides_others() -> None:
    alice = UserRecord(id=1, name="alice", role=Role.USER, created_at=NOW)
    mine = job("mine", "alice", spec_doc("mine", dp_replicate=2))
    theirs = job("theirs", "bob", spec_doc("theirs", dp_replicate=2))
    usage = views.gpu_usage([(mine, [rank(mine.id, 0, "a", 0), rank(mine.id, 1, "a", 1)]),
                             (theirs, [rank(theirs.id, 0, "a", 2), rank(theirs.id, 1, None, None)])],
                            viewer=alice)
    assert usage[("a", 0)].job_id == mine.id and usage[("a", 1)].rank == 1
    assert usage[("a", 2)].hidden and usage[("a", 2)].job_id is None
    assert len(usage) == 3  # an unplaced rank holds no GPU
    (view,) = views.node_views([node("a", {})], usage)
    assert view.used == 3 and len(view.gpus) == 8


def test_comm_signature_without_placement_has_rows_but_no_time() -> None:
    j = job("tp", "alice", spec_doc("tp", tp=2, dp_replicate=2), world=4)
    comm = views.comm_signature(j, ranks=[], nodes=[])
    assert comm is not None
    assert [r.dimension for r in comm.rows] == ["tp", "dp_replicate"]
    assert all(r.est_time == "" for r in comm.rows) and "once every rank is placed" in comm.note


def test_comm_signature_of_a_single_rank_is_empty() -> None:
    comm = views.comm_signature(job("one", "a", spec_doc("one"), world=1), ranks=[], nodes=[])
    assert comm is not None and comm.rows == () and "single rank" in comm.note


def test_comm_signature_estimates_on_cpu_ranks_say_why_not() -> None:
    j = job("cpu", "alice", spec_doc("cpu", dp_replicate=2))
    comm = views.comm_signature(j, ranks=[rank(j.id, 0, "a", None), rank(j.id, 1, "a", None)],
                                nodes=[node("a", {}, gpus=0)])
    assert comm is not None and "without GPUs" in comm.note


def test_comm_signature_of_a_script_estimates_no_model_it_does_not_run() -> None:
    doc = {"name": "script", "entrypoint": {"command": ["python", "train.py"]},
           "parallelism": {"dp_replicate": 2}}
    j = job("script", "alice", doc)
    comm = views.comm_signature(j, ranks=[rank(j.id, 0, "a", None), rank(j.id, 1, "a", None)],
                                nodes=[node("a", {}, gpus=0)])
    assert comm is not None and comm.rows == () and comm.total == "—"
    assert "runs its own code" in comm.note and "rank table" in comm.note


def test_human_units() -> None:
    assert views.human_bytes(33554432) == "32.0 MiB"
    assert views.human_bytes(512) == "512 B"
    assert views.human_seconds(0.0021) == "2.10 ms"
    assert views.human_seconds(None) == "—"


def test_ranges_and_holders_compact_a_node() -> None:
    assert views.ranges([0, 1, 2, 3, 6]) == "0–3, 6"
    assert views.ranges([]) == ""
    use = {("a", g): views.GpuUse(gpu=g, job_id="job-x", job_name="x", rank=8 + g)
           for g in range(4)}
    (view,) = views.node_views([node("a", {})], use)
    assert [(h.job_name, h.gpus, h.ranks) for h in view.holders] == [("x", "0–3", "8–11")]


def test_comm_estimate_ignores_nodes_no_job_can_use() -> None:
    """The usual Ray layout: a CPU-only head without the topology labels next to the GPU
    nodes. It must not keep the estimate from appearing."""
    from orchestrator.topology.model import NodeTopology
    from orchestrator.topology.serialize import node_topology_to_dict

    topo = node_topology_to_dict(NodeTopology.uniform(4, "NV18"))
    nodes = [node("head", {}, gpus=0), node("g1", {"leaf": "l0"}, gpus=4, topology=topo),
             node("g2", {"leaf": "l1"}, gpus=4, topology=topo)]
    j = job("dp", "alice", spec_doc("dp", dp_replicate=4), world=4)
    ranks = [rank(j.id, r, "g1" if r < 2 else "g2", r % 2) for r in range(4)]
    comm = views.comm_signature(j, ranks=ranks, nodes=nodes)
    assert comm is not None and comm.note.startswith("Estimated per step"), comm.note
    assert comm.rows[0].est_time != ""


def test_plan_units_fit_small_models() -> None:
    assert views.human_gb(0.0004) == "400 KB"
    assert views.human_gb(0.5) == "500.0 MB"
    assert views.human_gb(12.25) == "12.2 GB"
    assert views.human_seconds(5.473e-06) == "5 µs"
