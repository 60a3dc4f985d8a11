"""Lifecycle: every legal transition yields an event; every illegal one raises."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.lifecycle import (
    FAILURE_REASONS,
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    Reason,
    transition,
)

ALL_PAIRS = list(itertools.product(JobState, JobState))
LEGAL = [(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a]]
ILLEGAL = [(a, b) for a, b in ALL_PAIRS if b not in TRANSITIONS[a]]


def _reason_for(dst: JobState) -> Reason:
    return Reason.WORKER_CRASH if dst == JobState.FAILED else Reason.PLACEMENT_FOUND


@pytest.mark.parametrize(("src", "dst"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
def test_legal_transition_records_event(src: JobState, dst: JobState) -> None:
    ev = transition(src, dst, reason=_reason_for(dst), message="why", data={"k": 1})
    assert (ev.src, ev.dst, ev.message, ev.data) == (src, dst, "why", {"k": 1})
    assert ev.at.tzinfo is not None


@pytest.mark.parametrize(("src", "dst"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_illegal_transition_raises(src: JobState, dst: JobState) -> None:
    with pytest.raises(IllegalTransition, match=f"illegal job transition {src} -> {dst}"):
        transition(src, dst, reason=_reason_for(dst))


def test_terminal_states_have_no_exits() -> None:
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
        assert state.terminal


def test_every_state_reachable_from_queued() -> None:
    seen, frontier = {JobState.QUEUED}, [JobState.QUEUED]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(JobState)


def test_failed_needs_a_failure_reason() -> None:
    with pytest.raises(ValueError, match="failure reason"):
        transition(JobState.RUNNING, JobState.FAILED, reason=Reason.COMPLETED)
    for reason in FAILURE_REASONS:
        assert transition(JobState.RUNNING, JobState.FAILED, reason=reason).reason == reason


def test_counts() -> None:
    # guards against an accidental edit widening the table
    assert len(LEGAL) == sum(len(v) for v in TRANSITIONS.values()) == 30
    assert len(ILLEGAL) == 100 - 30


def test_a_preempted_job_is_requeued_or_ends_but_never_runs_on() -> None:
    for src in (JobState.STARTING, JobState.RUNNING):
        assert JobState.PREEMPTED in TRANSITIONS[src]
    assert TRANSITIONS[JobState.PREEMPTED] == {
        JobState.QUEUED, JobState.SUCCEEDED, JobState.RESTARTING, JobState.CANCELLING,
        JobState.FAILED}
    assert transition(JobState.PREEMPTED, JobState.QUEUED, reason=Reason.PREEMPTED).dst \
        == JobState.QUEUED
