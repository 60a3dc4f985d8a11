"""Running a function where the files are, for what a rank left on its host's disk (log
tails, metrics files, announcements, node evidence, the node's own discovery) and that the
control plane never reads through its own disk.

Each node has one long-lived agent, a Ray actor pinned there (hard node affinity) that runs
the control plane's functions on that node's disk, several at once. An actor, not a task per
read: Ray reaps an idle task worker within seconds, so a task per read starts a new Python
worker process on each node at every attempt's end (about a CPU-second each, on the loaded
host whose ranks just finished; Ray 2.60 starts two for a task pinned to a node where its
job has no idle worker).

The agent is a named actor in meshyard's Ray namespace (`AGENT_PREFIX` + the node id),
made by the first process that asks and found by the others; it lives while the process that
made it does (the runtime's driver, as a rule, or an attempt's controller), so a call that
finds it gone asks again once. An agent that does not answer in time is killed (a cut-off
node, or a read hung on a broken disk): the next call makes a new one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray import ObjectRef
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.runtime.events import NAMESPACE

AGENT_PREFIX = "meshyard-node-agent-"
MAX_CALLS = 8  # calls one agent runs at once (reads of several attempts ending together)


class NodeAgent:
    """Runs `fn(**kwargs)` in this node's process (the functions are the control plane's)."""

    def pid(self) -> int:
        return os.getpid()

    def call(self, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
        return fn(**kwargs)


_RemoteAgent: Any = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0,
                               max_concurrency=MAX_CALLS)(NodeAgent)

_lock = threading.Lock()
_agents: dict[tuple[str, str], Any] = {}  # (Ray job id, node id) -> this process's handle


def _key(nid: str) -> tuple[str, str]:
    return ray.get_runtime_context().get_job_id(), nid


def agent(nid: str) -> Any:
    """The agent of node `nid`: this process's handle, else the one the cluster has, else a
    new one made there."""
    key = _key(nid)
    with _lock:
        handle = _agents.get(key)
        if handle is None:
            handle = _agents[key] = _RemoteAgent.options(
                name=AGENT_PREFIX + nid, namespace=NAMESPACE, get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
        return handle


def forget(nid: str, *, kill: bool = False) -> None:
    """Drops this process's handle of node `nid`'s agent (it died: the next call asks again);
    `kill`: ends the agent too (it did not answer: a cut-off node or a hung call)."""
    with _lock:
        handle = _agents.pop(_key(nid), None)
    if kill and handle is not None:
        with contextlib.suppress(Exception):  # already gone, or its node is
            ray.kill(handle, no_restart=True)


def start_on_nodes(fn: Callable[..., Any], work: Mapping[str, Mapping[str, Any]]
                   ) -> dict[str, ObjectRef]:
    """`fn(**kwargs)` started on each node of `work` (Ray node id -> kwargs) by its agent; per
    node the reference of its value, for a caller that collects the answers when they come
    (and calls `abandon` for one that does not come, `failed` for one that failed)."""
    return {nid: agent(nid).call.remote(fn, dict(kwargs)) for nid, kwargs in work.items()}


def abandon(nid: str) -> None:
    """A call on node `nid` got no answer in time: its agent is ended, the next call makes a
    new one."""
    forget(nid, kill=True)


def failed(nid: str, exc: BaseException) -> None:
    """A call on node `nid` raised `exc`: if its agent died (its maker ended, or its node),
    the next call asks again."""
    if isinstance(exc, RayActorError):
        forget(nid)


def run_on_nodes(fn: Callable[..., Any], work: Mapping[str, Mapping[str, Any]], *,
                 timeout_s: float) -> dict[str, Any]:
    """`fn(**kwargs)` on each node of `work` (Ray node id -> kwargs), all at once; per node
    its value, or the exception when it failed or did not answer within `timeout_s`, one
    deadline for all (a cut-off node must not hold the caller). A call whose agent was gone
    (its maker ended) is made once more, on a new agent, within the same deadline."""
    deadline = time.monotonic() + timeout_s
    out: dict[str, Any] = {}
    todo = dict(work)
    for again in (False, True):
        refs = start_on_nodes(fn, todo)
        ready = set(ray.wait(list(refs.values()), num_returns=len(refs),
                             timeout=max(0.0, deadline - time.monotonic()))[0]) if refs else set()
        retry: dict[str, Mapping[str, Any]] = {}
        for nid, ref in refs.items():
            if ref not in ready:  # a dead or cut-off node: the caller decides
                abandon(nid)
                out[nid] = GetTimeoutError(f"node {nid} did not answer within {timeout_s:g} s")
                continue
            try:
                out[nid] = ray.get(ref, timeout=0)
            except Exception as exc:  # noqa: BLE001 - the function failed there
                failed(nid, exc)
                if isinstance(exc, RayActorError) and not again:
                    retry[nid] = todo[nid]
                out[nid] = exc
        if not retry:
            break
        todo = retry
    return out
