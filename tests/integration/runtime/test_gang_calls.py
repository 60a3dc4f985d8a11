"""The controller's calls to a gang's workers, on real Ray actors: one deadline for all the
ranks (not one per rank, which a partition multiplies), and a rank cut off from the controller
waited for only a short grace once the others answered."""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from orchestrator.runtime.gang import Answers, gather_answers


@ray.remote(num_cpus=0, max_concurrency=8)
class _Answerer:
    def answer(self, rank: int, delay_s: float) -> int:
        time.sleep(delay_s)
        return rank

    def fail(self) -> None:
        raise ValueError("the evidence could not be read")


@pytest.fixture()
def answerer(ray_connected: Any) -> Any:
    a = _Answerer.remote()
    ray.get(a.answer.remote(-1, 0.0), timeout=60)  # started
    yield a
    ray.kill(a, no_restart=True)


def test_ranks_that_never_answer_share_one_deadline(answerer: Any) -> None:
    refs = {r: answerer.answer.remote(r, 60.0) for r in range(4)}
    start = time.monotonic()
    values, errors = gather_answers(refs, timeout_s=2.0)
    took = time.monotonic() - start
    assert values == {}
    assert set(errors) == {0, 1, 2, 3}
    assert all(isinstance(e, GetTimeoutError) for e in errors.values())
    # a deadline per rank would be 8 s; the bound is loose for a loaded host
    assert took < 6.0, took


def test_a_cut_off_rank_is_waited_for_a_grace_after_the_others(answerer: Any) -> None:
    refs = {0: answerer.answer.remote(0, 0.0), 1: answerer.answer.remote(1, 0.2),
            2: answerer.answer.remote(2, 60.0)}
    start = time.monotonic()
    values, errors = gather_answers(refs, timeout_s=40.0, cut_off={2}, grace_s=0.5)
    took = time.monotonic() - start
    assert values == {0: 0, 1: 1}
    assert isinstance(errors[2], GetTimeoutError)
    assert took < 20.0, took  # not the 40 s a rank that may still answer is given


def test_a_cut_off_rank_that_answers_in_time_counts(answerer: Any) -> None:
    refs = {0: answerer.answer.remote(0, 0.0), 1: answerer.answer.remote(1, 0.3)}
    values, errors = gather_answers(refs, timeout_s=30.0, cut_off={1}, grace_s=20.0)
    assert values == {0: 0, 1: 1} and errors == {}


def test_a_call_that_raises_is_an_error_not_a_timeout(answerer: Any) -> None:
    refs = {0: answerer.answer.remote(0, 0.0), 1: answerer.fail.remote()}
    values, errors = gather_answers(refs, timeout_s=30.0)
    assert values == {0: 0}
    assert isinstance(errors[1], RayTaskError)
    assert "the evidence could not be read" in str(errors[1])


def test_answers_are_read_as_they_come_without_waiting_for_the_rest(answerer: Any) -> None:
    """`wait(0)` reads what answered and returns: a rank that does not answer holds no
    reader."""
    refs = {0: answerer.answer.remote(0, 0.0), 1: answerer.answer.remote(1, 60.0)}
    answers = Answers(refs, timeout_s=4.0)
    reads = 0
    while 0 not in answers.values and reads < 200:
        start = time.monotonic()
        assert answers.wait(0.0) is False
        assert time.monotonic() - start < 2.0  # a read, not a wait for rank 1
        assert not answers.done
        reads += 1
        time.sleep(0.05)
    assert answers.values == {0: 0} and answers.errors == {}
    assert answers.wait() is True  # until the deadline: rank 1 never answered
    assert answers.done and answers.values == {0: 0}
    assert isinstance(answers.errors[1], GetTimeoutError)


def test_a_rank_cut_off_while_its_call_is_out_is_given_up_then(answerer: Any) -> None:
    """Who is cut off is asked as the call goes: a rank whose silence reaches the cut-off
    during a diagnosis round is waited for a grace after that, not the round's deadline."""
    refs = {0: answerer.answer.remote(0, 0.0), 1: answerer.answer.remote(1, 60.0)}
    start = time.monotonic()
    asked: list[float] = []

    def cut_off() -> set[int]:
        asked.append(time.monotonic() - start)
        return {1} if time.monotonic() - start >= 1.5 else set()

    values, errors = gather_answers(refs, timeout_s=40.0, cut_off=cut_off, grace_s=0.5)
    took = time.monotonic() - start
    assert values == {0: 0}
    assert isinstance(errors[1], GetTimeoutError)
    assert any(t < 1.5 for t in asked) and any(t >= 1.5 for t in asked)  # asked again
    assert took < 20.0, took  # not the 40 s deadline
