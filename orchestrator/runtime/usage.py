"""Node utilisation: every live node the store knows is sampled by a task pinned to it
(`workers.usage.node_sample`: CPU %, memory, every GPU through NVML), at the runtime's node
sampling interval; samples older than the retention window are pruned. Per-rank samples come
with the workers' polls instead (orchestrator/runtime/gang.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.store.repo import Store
from workers.usage import node_sample

log = logging.getLogger("meshyard.runtime")
_sample: Any = ray.remote(num_cpus=0, max_retries=0)(node_sample)


def sample_nodes(store: Store, *, timeout_s: float = 10.0, retention_s: float = 86400.0) -> int:
    """One sample of every live node into the store; returns how many answered. A node that
    does not answer within `timeout_s` is skipped (its task is cancelled)."""
    nodes = {n.node_id: n.name for n in store.list_nodes() if n.alive and n.node_id}
    refs = {_sample.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        nid, soft=False)).remote(name): name for nid, name in nodes.items()}
    if not refs:
        return 0
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in pending:
        ray.cancel(ref, force=True)
    rows = []
    for ref in ready:
        try:
            rows.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - one node's failure skips that node only
            log.info("node sample of %s failed: %s", refs[ref], exc)
    store.add_node_usage(rows)
    store.prune_node_usage(before=time.time() - retention_s)
    return len(rows)
