"""Running a function where the files are: one Ray task pinned to each node (hard node
affinity), for what a rank left on its host's disk (log tails, metrics files, announcements,
node evidence) and that the control plane never reads through its own disk."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray import ObjectRef
from ray.exceptions import GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def start_on_nodes(fn: Callable[..., Any], work: Mapping[str, Mapping[str, Any]]
                   ) -> dict[str, ObjectRef]:
    """`fn(**kwargs)` started on each node of `work` (Ray node id -> kwargs); per node the
    reference of its value, for a caller that collects the answers when they come."""
    task: Any = ray.remote(num_cpus=0, max_retries=0)(fn)
    return {nid: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        nid, soft=False)).remote(**kwargs) for nid, kwargs in work.items()}


def run_on_nodes(fn: Callable[..., Any], work: Mapping[str, Mapping[str, Any]], *,
                 timeout_s: float) -> dict[str, Any]:
    """`fn(**kwargs)` on each node of `work` (Ray node id -> kwargs), all at once; per node
    its value, or the exception when it failed or did not answer within `timeout_s`, one
    deadline for all (the task is then cancelled: a cut-off node must not hold the caller)."""
    refs = start_on_nodes(fn, work)
    ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)[0]
                ) if refs else set()
    out: dict[str, Any] = {}
    for nid, ref in refs.items():
        if ref not in ready:  # a dead or cut-off node: the caller decides
            ray.cancel(ref, force=True)
            out[nid] = GetTimeoutError(f"node {nid} did not answer within {timeout_s:g} s")
            continue
        try:
            out[nid] = ray.get(ref, timeout=0)
        except Exception as exc:  # noqa: BLE001 - the function failed there
            out[nid] = exc
    return out
