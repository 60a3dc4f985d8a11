"""The runtime's policies, table-driven and without Ray: restart decisions and avoided nodes."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import Reason
from orchestrator.runtime.policy import (
    AttemptFailure,
    Outcome,
    avoid_nodes,
    fewer_avoided,
    restart_decision,
)
from orchestrator.spec import WatchdogAction

RESTART_CASES = [
    # attempt, failed so far, max_failures, hang action, cancelling -> outcome, reason
    (1, 1, 3, None, False, Outcome.RESTART, Reason.WORKER_CRASH),
    (3, 3, 3, None, False, Outcome.RESTART, Reason.WORKER_CRASH),
    (4, 4, 3, None, False, Outcome.FAIL, Reason.MAX_FAILURES),
    (1, 1, 0, None, False, Outcome.FAIL, Reason.WORKER_CRASH),  # no restart allowed
    (1, 1, 3, WatchdogAction.FAIL, False, Outcome.FAIL, Reason.WORKER_CRASH),
    (1, 1, 3, WatchdogAction.RESTART, False, Outcome.RESTART, Reason.WORKER_CRASH),
    (2, 2, 3, None, True, Outcome.FINISH_CANCEL, Reason.WORKER_CRASH),
    (9, 9, 3, WatchdogAction.FAIL, True, Outcome.FINISH_CANCEL, Reason.WORKER_CRASH),
]


@pytest.mark.parametrize(("attempt", "failed", "max_failures", "hang", "cancelling",
                          "outcome", "reason"), RESTART_CASES)
def test_restart_decision(attempt: int, failed: int, max_failures: int,
                          hang: WatchdogAction | None, cancelling: bool, outcome: Outcome,
                          reason: Reason) -> None:
    d = restart_decision(attempt=attempt, failed=failed, max_failures=max_failures,
                         reason=Reason.WORKER_CRASH, message="rank 0 died", hang_action=hang,
                         cancelling=cancelling)
    assert (d.outcome, d.reason) == (outcome, reason)
    assert "rank 0 died" in d.message


def test_restart_messages_count_attempts_and_name_the_next_one() -> None:
    d = restart_decision(attempt=2, failed=2, max_failures=3, reason=Reason.HANG_DETECTED,
                         message="hang detected: rank 1")
    assert d.message == "attempt 2 failed (2 of 4 allowed): hang detected: rank 1"
    assert d.requeue_message == "attempt 3 will resume from the latest checkpoint"
    last = restart_decision(attempt=3, failed=3, max_failures=2, reason=Reason.WORKER_CRASH,
                            message="boom")
    assert last.message == "3 failed attempts (max_failures=2); last: boom"


def _f(attempt: int, failed: tuple[str, ...] = (), avoid: tuple[str, ...] = ()) -> AttemptFailure:
    return AttemptFailure(attempt=attempt, failed_nodes=failed, avoid_nodes=avoid)


AVOID_CASES = [
    # current attempt, failures so far -> nodes the next attempt avoids
    (0, [_f(1, ("n1",), ("n9",))], set()),
    (1, [_f(1, ("n1",))], set()),  # one failure on a node is not a pattern yet
    (1, [_f(1, ("n1",), ("n2",))], {"n2"}),  # the hang watchdog's suspect, at once
    (2, [_f(1, ("n1",)), _f(2, ("n1",))], {"n1"}),  # failed in two attempts
    (2, [_f(1, ("n1",)), _f(2, ("n2",))], set()),
    (3, [_f(1, ("n1", "n1")), _f(2, ("n2",)), _f(3, ("n2", "n3"))], {"n2"}),
    (3, [_f(1, ("n1",)), _f(2, (), ("n4",)), _f(3, ("n1",))], {"n1", "n4"}),
]


@pytest.mark.parametrize(("current", "failures", "expected"), AVOID_CASES)
def test_avoid_nodes(current: int, failures: list[AttemptFailure], expected: set[str]) -> None:
    assert avoid_nodes(current_attempt=current, failures=failures) == expected


def test_attempt_failure_round_trips_through_the_stored_event_data() -> None:
    f = _f(2, ("n1", "n2"), ("n2",))
    data = f.event_data(groups=[{"signature": "x"}])
    assert data == {"groups": [{"signature": "x"}], "failed_nodes": ["n1", "n2"],
                    "avoid_nodes": ["n2"], "attempt": 2, "blame": "infra"}
    assert AttemptFailure.from_event_data(data) == f
    # a controller-lost failure stores no avoid list
    assert AttemptFailure.from_event_data({"failed_nodes": [], "attempt": 1}) == _f(1)


def test_a_user_error_fails_at_once_and_names_how_to_retry_it() -> None:
    d = restart_decision(attempt=1, failed=1, max_failures=3, reason=Reason.WORKER_CRASH,
                         message="AttributeError at train.py:9 in main: x (rank 1 on n1)",
                         user_error=True)
    assert d.outcome == Outcome.FAIL and d.reason == Reason.USER_ERROR
    assert d.message.startswith("AttributeError at train.py:9 in main")
    assert "retry_on" in d.message
    # The same failure that retry_on names (user_error False) is restarted like any other.
    d = restart_decision(attempt=1, failed=1, max_failures=3, reason=Reason.WORKER_CRASH,
                         message="ConnectionError", user_error=False)
    assert d.outcome == Outcome.RESTART


def test_policy_docstring_examples() -> None:
    import doctest

    from orchestrator.runtime import policy

    assert doctest.testmod(policy).failed == 0


@pytest.mark.parametrize("avoid,failures,expected", [
    # a slow link between h1 and h2 named both: keep away from one of them first
    ({"h1", "h2"}, [_f(1, avoid=("h1", "h2"))], [["h1"], []]),
    # the second attempt, placed on h1 + h3, failed too: h1 is named twice, kept longest
    ({"h1", "h2", "h3"}, [_f(1, avoid=("h1", "h2")), _f(2, avoid=("h1", "h3"))],
     [["h1", "h2"], ["h1"], []]),
    # failed nodes count like suspects; one node: only the empty list is left
    ({"n2"}, [_f(1, failed=("n2",)), _f(2, failed=("n2",))], [[]]),
])
def test_fewer_avoided_keeps_the_most_named_nodes_longest(
        avoid: set[str], failures: list[AttemptFailure], expected: list[list[str]]) -> None:
    assert fewer_avoided(avoid, failures) == expected


def test_a_store_that_stayed_down_restarts_like_other_infrastructure_but_a_setup_error_fails(
        ) -> None:
    down = restart_decision(attempt=2, failed=2, max_failures=3,
                            reason=Reason.STORE_UNAVAILABLE, message="the store did not answer")
    assert down.outcome is Outcome.RESTART and "2 of 4 allowed" in down.message
    spent = restart_decision(attempt=4, failed=4, max_failures=3,
                             reason=Reason.STORE_UNAVAILABLE, message="the store did not answer")
    assert (spent.outcome, spent.reason) == (Outcome.FAIL, Reason.MAX_FAILURES)
    setup = restart_decision(attempt=2, failed=2, max_failures=3, reason=Reason.SETUP_ERROR,
                             message="a host's disk cannot hold the checkpoint")
    assert setup.outcome is Outcome.FAIL
