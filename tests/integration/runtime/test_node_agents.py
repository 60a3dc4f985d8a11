"""The node agents on the package's simulated cluster: what the control plane reads on a node
runs in one long-lived actor pinned there (no new Ray worker process per read), found by name
from any process of the job; an agent that died is replaced within the same call, one that
stops answering is ended and replaced at the next call, and a function's own failure is that
node's answer."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

import pytest
import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from orchestrator.runtime.events import NAMESPACE
from orchestrator.runtime.on_nodes import AGENT_PREFIX, run_on_nodes
from tests.support.processes import gone


def _where(tag: str) -> dict[str, Any]:
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "tag": tag}


def _unreadable() -> None:
    raise ValueError("the rank's file could not be read")


@ray.remote(num_cpus=0, max_retries=0)
def _from_another_process(nid: str) -> int:
    """What an attempt's controller sees: the agent the driver made, found by its name."""
    return int(run_on_nodes(_where, {nid: {"tag": "other"}}, timeout_s=60)[nid]["pid"])


@pytest.mark.slow
def test_reads_run_in_one_agent_per_node_which_is_replaced_when_dead_or_stuck(
        ray_connected: Any) -> None:
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    assert len(nodes) == 4
    first = run_on_nodes(_where, {nid: {"tag": nid[:8]} for nid in nodes}, timeout_s=120)
    assert {nid: (got["node"], got["tag"]) for nid, got in first.items()} == \
        {nid: (nid, nid[:8]) for nid in nodes}  # each ran on its own node
    pids = {nid: got["pid"] for nid, got in first.items()}
    assert len(set(pids.values())) == len(nodes)
    for _ in range(3):  # the same processes answer every read
        again = run_on_nodes(_where, {nid: {"tag": "x"} for nid in nodes}, timeout_s=60)
        assert {nid: got["pid"] for nid, got in again.items()} == pids
    names = {(a["namespace"], a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)}
    assert {(NAMESPACE, AGENT_PREFIX + nid) for nid in nodes} <= names

    n1 = nodes[1]
    assert ray.get(_from_another_process.remote(n1), timeout=120) == pids[n1]

    # The function fails there: that node's answer is the error, its agent stays.
    failed = run_on_nodes(_unreadable, {n1: {}}, timeout_s=60)[n1]
    assert isinstance(failed, RayTaskError) and "could not be read" in str(failed)
    assert run_on_nodes(_where, {n1: {"tag": "y"}}, timeout_s=60)[n1]["pid"] == pids[n1]

    # The agent dies (its node's OOM killer, or its maker ended): the same call is answered
    # by a new agent.
    os.kill(pids[n1], signal.SIGKILL)
    assert gone({pids[n1]})
    second = run_on_nodes(_where, {n1: {"tag": "z"}}, timeout_s=120)[n1]
    assert isinstance(second, dict) and second["pid"] != pids[n1] and second["node"] == n1

    # The agent stops answering (a read hung on a broken disk, a cut-off host): the call
    # names the node as not answering in time, the agent is ended, the next call has a new one.
    os.kill(second["pid"], signal.SIGSTOP)
    try:
        stuck = run_on_nodes(_where, {n1: {"tag": "s"}, nodes[2]: {"tag": "s"}}, timeout_s=3)
        assert isinstance(stuck[n1], GetTimeoutError)
        assert stuck[nodes[2]]["pid"] == pids[nodes[2]]  # the others answered
        assert gone({second["pid"]})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(second["pid"], signal.SIGCONT)  # lets it die if a step above failed
    third = run_on_nodes(_where, {n1: {"tag": "t"}}, timeout_s=120)[n1]
    assert isinstance(third, dict) and third["pid"] not in (pids[n1], second["pid"])
