"""Reservations (earliest gang-usable GPUs as running jobs end) and backfill behind them.

Cluster: leaves l0 = {n1, n2}, l1 = {n3, n4}, 4 NVSwitch GPUs per node. A tp=4 gang's TP group
needs a whole node, so free GPUs scattered over nodes do not count for it.
"""

import pytest

from orchestrator.placement.gang_plan import GangPlan
from orchestrator.scheduling.policy import Policy, schedule_pass
from orchestrator.scheduling.reservation import Reservation, find_reservation, release
from tests.unit.scheduling.support import NOW, TWO_LEAVES, cluster, planner, queued, running

ALL = (0, 1, 2, 3)

# (case, running jobs, gang (tp, dp), expected reserved nodes, start - NOW, waits_for)
CASES = [
    ("the two nodes free soonest",
     (running("a", {"n1": ALL}, ends_in=100), running("b", {"n2": (0, 1)}, ends_in=50),
      running("c", {"n3": ALL}, ends_in=200), running("d", {"n4": (0, 1)}, ends_in=300)),
     (4, 2), ["n1", "n2"], 100.0, ["a", "b"]),
    ("half-free nodes do not count for whole-node TP groups: 4 GPUs are free at +20, the "
     "gang's node only at +100",
     (running("x", {"n1": (0, 1)}, ends_in=10), running("y", {"n3": (0, 1)}, ends_in=20),
      running("z", {"n2": ALL}, ends_in=100), running("w", {"n1": (2, 3)}, ends_in=900),
      running("v", {"n3": (2, 3)}, ends_in=900), running("u", {"n4": ALL}, ends_in=900)),
     (4, 1), ["n2"], 100.0, ["z"]),
    ("a job without an estimate releases last: the gang waits for the known ones",
     (running("a", {"n1": ALL}), running("b", {"n2": (0, 1)}, ends_in=50),
      running("c", {"n3": ALL}, ends_in=200), running("d", {"n4": ALL}, ends_in=300)),
     (4, 2), ["n2", "n3"], 200.0, ["b", "c"]),
    ("needing a job without an estimate: the start is unknown",
     (running("a", {"n1": ALL}), running("b", {"n2": ALL}), running("c", {"n3": ALL}),
      running("d", {"n4": ALL}, ends_in=30)),
     (4, 2), None, None, None),
    ("an estimate already past counts as now",
     (running("a", {"n1": ALL}, ends_in=-500), running("b", {"n2": ALL}, ends_in=40),
      running("c", {"n3": ALL}, ends_in=10), running("d", {"n4": ALL}, ends_in=30)),
     (4, 3), ["n1", "n3", "n4"], 30.0, ["a", "c", "d"]),
]


@pytest.mark.parametrize(("case", "jobs", "shape", "nodes", "start", "waits"), CASES,
                         ids=[c[0][:40] for c in CASES])
def test_reservation(case, jobs, shape, nodes, start, waits):
    snap = cluster(TWO_LEAVES, running=jobs)
    gang = queued("gang", tp=shape[0], dp=shape[1])
    assert not isinstance(planner(gang, snap), GangPlan), "the gang must not fit now"
    res = find_reservation(gang, snap, jobs, now=NOW, plan=planner)
    assert res is not None
    if nodes is None:  # every job it could wait for lacks an estimate
        assert res.start is None
        assert not any(j.est_end is not None and j.id in res.waits_for
                       for j in jobs if j.est_end is None)
        return
    assert list(res.nodes) == nodes
    assert res.start == pytest.approx(NOW + start)
    assert sorted(res.waits_for) == waits
    # the reserved set is one the gang can use: freed, the planner places it exactly there
    freed = release(snap, (j.gpus_by_node for j in jobs if j.id in res.waits_for))
    plan = planner(gang, freed)
    assert isinstance(plan, GangPlan) and sorted(plan.gpus_by_node()) == nodes


def test_no_reservation_for_a_gang_bigger_than_the_cluster():
    jobs = (running("a", {"n1": ALL}, ends_in=10),)
    snap = cluster(TWO_LEAVES, running=jobs)
    assert find_reservation(queued("huge", tp=4, dp=5), snap, jobs, now=NOW,
                            plan=planner) is None


def test_bisection_calls_the_planner_about_log2_times():
    # 16 nodes, each running a one-node job ending one second apart; the gang needs 8 nodes
    nodes = {f"n{i:02d}": f"l{i // 4}" for i in range(16)}
    jobs = tuple(running(f"j{i:02d}", {n: ALL}, ends_in=10.0 + i)
                 for i, n in enumerate(sorted(nodes)))
    snap = cluster(nodes, running=jobs)
    calls = []

    def counting(job, s):
        calls.append(1)
        return planner(job, s)

    res = find_reservation(queued("gang", tp=4, dp=8), snap, jobs, now=NOW, plan=counting)
    assert res is not None and res.start == NOW + 17.0 and len(res.waits_for) == 8
    assert len(calls) <= 6


# Backfill behind a reservation of n1 + n2 starting at NOW + 100 (a ends +100 on n1, b ends
# +50 on n2's GPUs 0-1; n2 GPUs 2-3 free; n3 busy until +1000; n4 GPUs 0-1 free).
BACKFILL_RUNNING = (running("a", {"n1": ALL}, ends_in=100), running("b", {"n2": (0, 1)},
                                                                      ends_in=50),
                    running("c", {"n3": ALL}, ends_in=1000), running("d", {"n4": (2, 3)},
                                                                      ends_in=2000))


@pytest.mark.parametrize(("job", "placed_on"), [
    # fits outside the reserved GPUs: placed there, estimate or not
    (queued("small", tp=1, dp=2), "n4"),
    (queued("small-est", tp=1, dp=2, est=5000.0), "n4"),
    # needs the reserved GPUs and ends before the reservation starts: backfilled
    (queued("short", tp=1, dp=4, est=90.0), "n2,n4"),
    # needs the reserved GPUs and would still run at the start: waits
    (queued("long", tp=1, dp=4, est=150.0), None),
    # needs the reserved GPUs and has no estimate: waits
    (queued("unknown", tp=1, dp=4), None),
])
def test_backfill_behind_the_reservation(job, placed_on):
    snap = cluster(TWO_LEAVES, running=BACKFILL_RUNNING)
    gang = queued("gang", tp=4, dp=2, seq=0)
    out = schedule_pass([gang, job], snap, BACKFILL_RUNNING, now=NOW, plan=planner,
                        policy=Policy.RESERVE)
    res = out.reservation
    assert res is not None and res.job_id == "gang" and res.nodes == ("n1", "n2")
    assert res.start == NOW + 100
    reason = out.waiting["gang"]
    assert reason["reservation"]["expected_start"] == NOW + 100
    assert "waiting for b, a to end" in reason["message"] and "in 2 min" in reason["message"]
    if placed_on is None:
        assert out.placed == [] and "reserved for gang" in out.waiting[job.id]["message"]
    else:
        ((got, plan),) = out.placed
        assert got.id == job.id
        assert ",".join(sorted(plan.gpus_by_node())) == placed_on


def test_policies_differ_on_a_big_gang_behind_small_jobs():
    snap = cluster(TWO_LEAVES, running=BACKFILL_RUNNING)
    order = [queued("gang", tp=4, dp=2), queued("long", tp=1, dp=4, est=150.0),
             queued("one", est=10_000.0)]
    placed = {p: [j.id for j, _ in schedule_pass(order, snap, BACKFILL_RUNNING, now=NOW,
                                                 plan=planner, policy=p).placed]
              for p in Policy}
    assert placed[Policy.SKIP] == ["long"]  # takes n2 GPUs 2-3 the gang needs at +100
    assert placed[Policy.FIFO] == []  # everything waits behind the gang
    assert placed[Policy.RESERVE] == ["one"]  # only what cannot delay the gang (n4)
    # nothing outranks the running jobs, so preemption changes nothing here
    assert placed[Policy.RESERVE_PREEMPT] == ["one"]


def test_an_infeasible_job_takes_no_reservation():
    snap = cluster(TWO_LEAVES, running=BACKFILL_RUNNING)
    out = schedule_pass([queued("never", tp=4, dp=5), queued("long", tp=1, dp=4, est=150.0)],
                        snap, BACKFILL_RUNNING, now=NOW, plan=planner, policy=Policy.RESERVE)
    assert out.reservation is None and out.waiting["never"]["kind"] == "infeasible"
    assert [j.id for j, _ in out.placed] == ["long"]


def test_reason_with_an_unknown_start_says_why():
    res = Reservation(job_id="g", gpus={"n1": (0, 1)}, start=None, waits_for=("a",))
    snap = cluster(TWO_LEAVES, running=(running("a", {"n1": ALL}),))
    pending = planner(queued("g", tp=4, dp=4), snap)
    reason = res.reason(pending, now=NOW)  # type: ignore[arg-type]
    assert reason["reservation"]["expected_start"] is None
    assert "start unknown" in reason["message"] and "waiting for a to end" in reason["message"]


def test_no_backfill_onto_gpus_freed_by_preemption() -> None:
    """A victim that stopped for a preempting job would take its GPUs back (and be preempted
    again) if it could backfill there: a preempting reservation admits no one."""
    from orchestrator.scheduling.jobs import QueuedJob
    from orchestrator.scheduling.reservation import Reservation

    quick = QueuedJob(id="victim", priority=0, submitted_at=0.0, gpus=2, est_runtime_s=5.0)
    waiting = Reservation(job_id="big", gpus={"n1": (0, 1)}, start=100.0, waits_for=("a",))
    assert waiting.may_backfill(quick, now=0.0)
    preempting = Reservation(job_id="big", gpus={"n1": (0, 1)}, start=100.0,
                             waits_for=("victim",), preempting=True)
    assert not preempting.may_backfill(quick, now=0.0)
