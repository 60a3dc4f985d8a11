"""Property tests: whoever the culprit is (rank 0 included), whatever the layout, it is named."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.report import Verdict
from tests.unit.watchdog.synth import Job, Op, evidence, tp_dp_groups


def layered_job(world: int, tp: int, steps: int) -> Job:
    groups = tp_dp_groups(world, tp)
    tp_groups = [g for g, m in groups.items() if g != "0" and len(m) == tp and tp > 1]
    dp_groups = [g for g, m in groups.items() if g != "0" and m not in
                 [groups[t] for t in tp_groups]]
    program: list[Op] = []
    for _ in range(steps):
        program += [Op(g, "all_gather", ((tp, 8),)) for g in tp_groups]
        program += [Op(g, "all_reduce", ((64,),)) for g in dp_groups]
        program.append(Op("0", "all_reduce", ((1,),)))  # loss / grad-norm on the world group
    return Job(world=world, groups=groups, program=program)


layouts = st.sampled_from([(2, 1), (4, 1), (4, 2), (8, 2), (8, 4), (16, 4), (64, 8)])


@settings(max_examples=40, deadline=None)
@given(layout=layouts, data=st.data())
def test_hung_rank_is_always_the_culprit(layout: tuple[int, int], data: st.DataObject) -> None:
    world, tp = layout
    job = layered_job(world, tp, steps=3)
    culprit = data.draw(st.integers(0, world - 1), label="culprit")
    stop = data.draw(st.integers(1, len(job.program) - 1), label="stop")
    if not any(culprit in job.groups[op.pg] for op in job.program[stop:]):
        return
    job.stop_before[culprit] = stop
    rep = analyze(evidence(job))
    assert rep.verdict is Verdict.NOT_JOINED, rep.summary
    assert rep.culprit_ranks == (culprit,), rep.summary


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from([(3, 1), (4, 1), (8, 2), (16, 4)]), data=st.data())
def test_minority_size_mismatch_is_always_the_culprit(layout: tuple[int, int],
                                                       data: st.DataObject) -> None:
    world, tp = layout
    job = layered_job(world, tp, steps=2)
    # Only groups with >= 3 members have a majority to compare against.
    idx = [i for i, op in enumerate(job.program) if len(job.groups[op.pg]) >= 3]
    i = data.draw(st.sampled_from(idx), label="index")
    members = job.groups[job.program[i].pg]
    culprit = data.draw(st.sampled_from(members), label="culprit")
    job.replace[(culprit, i)] = Op(job.program[i].pg, job.program[i].op, ((999,),))
    rep = analyze(evidence(job))
    assert rep.verdict is Verdict.COLLECTIVE_MISMATCH, rep.summary
    assert rep.culprit_ranks == (culprit,)


@settings(max_examples=25, deadline=None)
@given(world=st.integers(2, 12), data=st.data())
def test_dead_rank_is_always_the_culprit(world: int, data: st.DataObject) -> None:
    job = Job(world=world, groups={"0": tuple(range(world))}, program=[Op("0")] * 5)
    culprit = data.draw(st.integers(0, world - 1))
    job.stop_before[culprit] = data.draw(st.integers(0, 4))
    rep = analyze(evidence(job, dead={culprit: "exit code 1"}))
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.RANK_EXITED, (culprit,))
