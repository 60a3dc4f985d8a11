"""Preemption choice: the cheapest set of lower-priority running jobs whose GPUs, freed, let
the gang planner place the queued job.

Cluster: leaves l0 = {n1, n2}, l1 = {n3, n4}, 4 NVSwitch GPUs per node; a tp=4 gang needs a
whole node. `since_ckpt`: seconds since the job's last checkpoint (lost work = GPUs x that).
"""

import pytest

from orchestrator.placement.gang_plan import GangPlan
from orchestrator.scheduling.policy import PassSettings, Policy, schedule_pass
from orchestrator.scheduling.preemption import candidates, choose_preemption
from tests.unit.scheduling.support import NOW, TWO_LEAVES, cluster, planner, queued, running

ALL = (0, 1, 2, 3)
HIGH = 5


def _keepers(jobs):
    """High-priority jobs nobody may preempt, one per node, on every GPU `jobs` leave free."""
    held = {(n, g) for j in jobs for n, gs in j.gpus_by_node.items() for g in gs}
    out = []
    for n in sorted(TWO_LEAVES):
        rest = tuple(g for g in ALL if (n, g) not in held)
        if rest:
            out.append(running(f"keep-{n}", {n: rest}, priority=HIGH))
    return tuple(out)


# (case, preemptible jobs, gang (tp, dp), expected victims or None)
CASES = [
    # x (n1, leaf l0) and y (n3, leaf l1) are the cheapest and free 4 GPUs together, but on
    # two nodes of different leaves: no node is whole. z frees n2 whole: chosen although it
    # loses more work than x and y together.
    ("two cheap jobs on different leaves lose to one on the right node",
     (running("x", {"n1": (0, 1)}, since_ckpt=60), running("y", {"n3": (0, 1)}, since_ckpt=60),
      running("z", {"n2": ALL}, since_ckpt=600)), (4, 1), ["z"]),
    ("least lost work wins over fewer jobs",
     (running("z", {"n2": ALL}, since_ckpt=600), running("p", {"n2": (0, 1)}, since_ckpt=100),
      ), (1, 2), ["p"]),
    ("equal lost work: the fewest jobs",
     (running("p", {"n2": (0,)}, since_ckpt=200), running("q", {"n2": (1,)}, since_ckpt=200),
      running("r", {"n2": (2, 3)}, since_ckpt=200)), (1, 2), ["r"]),  # 2 x 200 = 200 + 200
    ("a just-checkpointed job is the cheapest",
     (running("old", {"n2": (0, 1)}, since_ckpt=3000),
      running("fresh", {"n2": (2, 3)}, since_ckpt=5)), (1, 2), ["fresh"]),
    ("a non-preemptible job is never chosen, even when only it would do",
     (running("x", {"n1": (0, 1)}, since_ckpt=1),
      running("z", {"n2": ALL}, since_ckpt=1, preemptible=False)), (4, 1), None),
    ("a job inside its minimum run time is not preempted again",
     (running("x", {"n1": (0, 1)}), running("z", {"n2": ALL}, ran=60)), (4, 1), None),
    ("equal priority is never preempted",
     (running("z", {"n2": ALL}, priority=HIGH),), (4, 1), None),
    ("no checkpoint yet: the whole attempt is lost",
     (running("a", {"n2": (0, 1)}, ran=700), running("b", {"n2": (2, 3)}, ran=5000,
                                                       since_ckpt=1000)), (1, 2), ["a"]),
]


@pytest.mark.parametrize(("case", "jobs", "shape", "victims"), CASES,
                         ids=[c[0][:40] for c in CASES])
def test_choice(case, jobs, shape, victims):
    everyone = (*jobs, *_keepers(jobs))
    snap = cluster(TWO_LEAVES, running=everyone)
    gang = queued("gang", tp=shape[0], dp=shape[1], priority=HIGH)
    assert not isinstance(planner(gang, snap), GangPlan), "the gang must not fit now"
    got = choose_preemption(gang, snap, everyone, now=NOW, plan=planner, min_run_s=600)
    if victims is None:
        assert got is None
        return
    assert got is not None and sorted(got.victims) == victims
    lost = {j.id: j.lost_work_s(NOW) for j in jobs}
    assert got.lost_gpu_s == pytest.approx(sum(lost[v] for v in victims))
    # the plan uses only GPUs that are free or the victims'
    mine = {(n, g) for j in jobs if j.id in victims for n, gs in j.gpus_by_node.items()
            for g in gs}
    free = {(n.name, g) for n in snap.cluster.nodes for g in n.free_gpus}
    assert {(n, g) for n, gs in got.gpus.items() for g in gs} <= mine | free


def test_candidates_are_lower_priority_preemptible_and_past_their_minimum_run():
    jobs = [running("ok", {"n1": (0,)}, priority=1, since_ckpt=50),
            running("cheaper", {"n1": (1,)}, priority=0, since_ckpt=10),
            running("same", {"n1": (2,)}, priority=3),
            running("pinned", {"n1": (3,)}, preemptible=False),
            running("young", {"n2": (0,)}, ran=599)]
    got = candidates(queued("g", priority=3), jobs, now=NOW, min_run_s=600)
    assert [c.id for c in got] == ["cheaper", "ok"]


def test_many_small_jobs_make_room_for_a_big_gang_on_one_leaf():
    # 8 nodes in two leaves, every GPU held by a 1-GPU low-priority job; the gang needs two
    # whole nodes. Jobs on n1 and n2 (leaf l0) have the least lost work; the cheapest-set walk
    # cannot reach 8 jobs within its budget, so the per-domain search finds them.
    nodes = {f"n{i}": f"l{(i - 1) // 4}" for i in range(1, 9)}
    jobs = tuple(running(f"{n}g{g}", {n: (g,)}, since_ckpt=10 if n in ("n1", "n2") else 500)
                 for n in sorted(nodes) for g in ALL)
    snap = cluster(nodes, running=jobs)
    gang = queued("gang", tp=4, dp=2, priority=HIGH)
    got = choose_preemption(gang, snap, jobs, now=NOW, plan=planner)
    assert got is not None and len(got.victims) == 8
    assert {v[:2] for v in got.victims} == {"n1", "n2"}


def test_a_pass_reserves_the_victims_gpus_for_the_preemptor_until_they_stop():
    mine = (running("x", {"n1": (0, 1)}, since_ckpt=60), running("z", {"n2": ALL},
                                                                 since_ckpt=600))
    jobs = (*mine, *_keepers(mine))
    snap = cluster(TWO_LEAVES, running=jobs)
    order = [queued("gang", tp=4, priority=HIGH), queued("short", tp=1, dp=4, est=30.0)]
    out = schedule_pass(order, snap, jobs, now=NOW, plan=planner,
                        policy=Policy.RESERVE_PREEMPT, settings=PassSettings(grace_s=60))
    assert out.preemption is not None and out.preemption.victims == ("z",)
    res = out.reservation
    assert res is not None and res.preempting and res.nodes == ("n2",)
    assert res.start == NOW + 60
    assert "preempting z" in out.waiting["gang"]["message"]
    # "short" (30 s) would end before the victims stop, but needs n2: only the 4 GPUs of n2
    # and none elsewhere are free after the preemption, and during the grace the victims
    # still hold them, so it waits
    assert out.placed == []
    # without preemption the same pass reserves for the gang and preempts nothing
    plain = schedule_pass(order, snap, jobs, now=NOW, plan=planner, policy=Policy.RESERVE)
    assert plain.preemption is None and plain.reservation is not None
    assert not plain.reservation.preempting
