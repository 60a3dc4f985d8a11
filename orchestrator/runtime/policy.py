"""The runtime's policies: what to do after a failed attempt, which nodes the next one avoids.
Pure module: each function returns a decision; the poller and the scheduler apply it.

Restart (after attempt n failed, `failed` attempts failed so far, this one included):

    job cancelling                      -> FINISH_CANCEL (the failure was the cancel)
    PREFLIGHT_FAILED                    -> RESTART (placed around the slow link), not counted
                                           in max_failures, up to MAX_PREFLIGHT_RESTARTS
    the hang watchdog said fail         -> FAIL with the attempt's reason
    SETUP_ERROR (the code cannot load)  -> FAIL: the next attempt would fail the same way
    the job's own code raised / exited  -> FAIL as USER_ERROR (the exception and its line
      (failures.Blame.USER), unless        lead the message): a bug raises again; a failure
      fault_tolerance.retry_on names it    retry_on names goes on like any other
    failed - 1 < max_failures           -> RESTART: RESTARTING, then QUEUED for attempt n + 1
    max_failures == 0 (no restarts)     -> FAIL with the attempt's own reason and message
    otherwise                           -> FAIL with MAX_FAILURES

Infeasible (a queued job that can never fit the cluster as it is): fail it as INFEASIBLE once
it has waited `placement.timeout_s`, unless its spec asks to wait for capacity.

Avoid (for the job's next attempt): every node the hang watchdog named as a suspect, and from
the third attempt on, every node that was among the failed nodes of two or more attempts. An
attempt's failed nodes are those its cause points at (failures.Blame.NODE: the worker process
died, or a device / NIC error); a user's exception or a lost peer names no node. When avoiding
all of them leaves the job nowhere to go, it avoids as many as still let it fit, the nodes
named by the most failed attempts kept longest (`fewer_avoided`): a slow link between two
hosts names both, and the next placement then keeps away from one of them instead of from
neither.

>>> restart_decision(attempt=1, failed=1, max_failures=3, reason=Reason.WORKER_CRASH,
...                  message="rank 0 died").outcome
<Outcome.RESTART: 'restart'>
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator.lifecycle import Reason
from orchestrator.spec import WatchdogAction

MAX_PREFLIGHT_RESTARTS = 3  # placements re-tried after failed pre-flight checks


class Outcome(StrEnum):
    RESTART = "restart"
    FAIL = "fail"
    FINISH_CANCEL = "finish_cancel"


@dataclass(frozen=True)
class RestartDecision:
    """`reason` and `message` go with the RESTARTING or FAILED transition; a restart then
    queues the job with `requeue_message`."""

    outcome: Outcome
    reason: Reason
    message: str
    requeue_message: str = ""


def restart_decision(*, attempt: int, failed: int, max_failures: int, reason: Reason,
                     message: str, hang_action: WatchdogAction | None = None,
                     cancelling: bool = False, preflight_failed: int = 0,
                     user_error: bool = False) -> RestartDecision:
    """After attempt `attempt` failed; `failed` counts the job's failed attempts so far,
    `preflight_failed` those that failed the pre-flight check (not in `failed`); `user_error`:
    the job's own code failed and `retry_on` does not name the failure."""
    if cancelling:
        return RestartDecision(Outcome.FINISH_CANCEL, reason, message)
    if reason == Reason.PREFLIGHT_FAILED:
        if preflight_failed <= MAX_PREFLIGHT_RESTARTS:
            return RestartDecision(
                Outcome.RESTART, reason, f"attempt {attempt} failed its pre-flight check "
                f"({preflight_failed} of {MAX_PREFLIGHT_RESTARTS} allowed; not counted "
                f"in max_failures): {message}",
                requeue_message=f"attempt {attempt + 1} will be placed around the slow link")
        return RestartDecision(Outcome.FAIL, reason, f"{preflight_failed} attempts failed "
                               f"the pre-flight check; last: {message}")
    if hang_action == WatchdogAction.FAIL:  # watchdog.action=fail: a hang ends the job
        return RestartDecision(Outcome.FAIL, reason, f"attempt {attempt}: {message}")
    if reason == Reason.SETUP_ERROR:
        return RestartDecision(Outcome.FAIL, reason, f"attempt {attempt}: {message}")
    if user_error:
        return RestartDecision(Outcome.FAIL, Reason.USER_ERROR,
                               f"{message} — not restarted: an error of the job's own code "
                               "raises again (fault_tolerance.retry_on names the ones to "
                               "restart)")
    if failed - 1 < max_failures:
        return RestartDecision(
            Outcome.RESTART, reason,
            f"attempt {attempt} failed ({failed} of {max_failures + 1} allowed): {message}",
            requeue_message=f"attempt {attempt + 1} will resume from the latest checkpoint")
    if max_failures == 0:  # no restart was allowed: the attempt's failure is the job's
        return RestartDecision(Outcome.FAIL, reason, message)
    return RestartDecision(Outcome.FAIL, Reason.MAX_FAILURES,
                           f"{failed} failed attempts (max_failures={max_failures}); last: "
                           f"{message}")


@dataclass(frozen=True)
class AttemptFailure:
    """What a failed attempt left for the avoid policy: the nodes of its first failure group
    and the nodes the hang watchdog suspects. Stored as the attempt's error event data."""

    attempt: int
    failed_nodes: tuple[str, ...] = ()
    avoid_nodes: tuple[str, ...] = ()
    blame: str = "infra"  # failures.Blame of the attempt's cause

    def event_data(self, *, groups: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        return {"groups": list(groups), "failed_nodes": list(self.failed_nodes),
                "avoid_nodes": list(self.avoid_nodes), "attempt": self.attempt,
                "blame": self.blame}

    @classmethod
    def from_event_data(cls, data: Mapping[str, Any]) -> AttemptFailure:
        return cls(attempt=int(data.get("attempt") or 0),
                   failed_nodes=tuple(str(n) for n in data.get("failed_nodes") or ()),
                   avoid_nodes=tuple(str(n) for n in data.get("avoid_nodes") or ()),
                   blame=str(data.get("blame") or "infra"))


def nodes_failed_twice(failed_nodes_per_attempt: Iterable[Iterable[str]]) -> set[str]:
    """Nodes that appear in the failures of two or more attempts (to avoid on restart)."""
    counts: dict[str, int] = {}
    for nodes in failed_nodes_per_attempt:
        for n in set(nodes):
            counts[n] = counts.get(n, 0) + 1
    return {n for n, c in counts.items() if c >= 2}


def avoid_nodes(*, current_attempt: int, failures: Sequence[AttemptFailure]) -> set[str]:
    """Nodes the job's next attempt must not use (see the module doc)."""
    if current_attempt < 1:
        return set()
    suspects = {n for f in failures for n in f.avoid_nodes}
    if current_attempt < 2:
        return suspects
    return nodes_failed_twice(f.failed_nodes for f in failures) | suspects


def fewer_avoided(avoid: Iterable[str], failures: Sequence[AttemptFailure]) -> list[list[str]]:
    """Smaller avoid lists to try, in order, when avoiding all of `avoid` does not fit: the
    nodes the most failed attempts named (as suspects or failed nodes) are kept longest; ties
    by name. Ends with the empty list.

    >>> f = [AttemptFailure(1, avoid_nodes=("h1", "h2")),
    ...      AttemptFailure(2, avoid_nodes=("h2", "h3"))]
    >>> fewer_avoided({"h1", "h2", "h3"}, f)
    [['h2', 'h1'], ['h2'], []]
    """
    named = Counter(n for f in failures for n in {*f.avoid_nodes, *f.failed_nodes})
    order = sorted(avoid, key=lambda n: (-named[n], n))
    return [order[:k] for k in range(len(order) - 1, -1, -1)]


def fail_infeasible(*, infeasible_since: float, now: float, timeout_s: float,
                    wait_for_capacity: bool) -> bool:
    """True when a job that never fits has waited long enough to fail as INFEASIBLE.

    >>> fail_infeasible(infeasible_since=0, now=301, timeout_s=300, wait_for_capacity=False)
    True
    """
    return not wait_for_capacity and now - infeasible_since >= timeout_s
