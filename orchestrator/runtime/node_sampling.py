"""Node utilisation: every live node the store knows is sampled at the runtime's node sampling
interval through one long-lived actor pinned to it (`NodeSamplers`: a
`workers.host.sampling.NodeSampler` in a Ray worker that reserves no CPU); samples older than the
retention window are pruned. Per-rank samples come with the workers' polls instead
(orchestrator/runtime/gang.py).

An actor, not a task per sample: Ray reaps an idle task worker within seconds, so a task per
sample starts a new Python worker process on every node each time (about a CPU-second, and a
worker registration with the cluster, per node per sample, beside the training it measures).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.store.repo import Store
from workers.host.sampling import NodeSampler

log = logging.getLogger("meshyard.runtime")


class _SamplerActor:
    def __init__(self) -> None:
        self._sampler = NodeSampler()

    def pid(self) -> int:
        return os.getpid()

    def sample(self, node: str) -> dict[str, Any]:
        return self._sampler.sample(node)


_RemoteSampler: Any = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(_SamplerActor)


class NodeSamplers:
    """One sampler actor per live node, started at the node's first sample and kept.

    A sample not back within `timeout_s` is waited for again at the next pass (a new actor's
    first answer waits for its process to start); one still not back then, or one that
    failed, gets its actor killed, and the node a new one at the next pass (an NVML call that
    hangs on a broken GPU is not queued behind). A node gone from the store's live nodes has
    its actor killed. `close()` kills them all. Used from one thread.
    """

    def __init__(self) -> None:
        self._actors: dict[str, Any] = {}
        self._waiting: dict[str, Any] = {}  # node id -> a sample ref not back at its pass

    def sample(self, store: Store, *, timeout_s: float = 10.0,
               retention_s: float = 86400.0) -> int:
        """One sample of every live node into the store; returns how many answered."""
        nodes = {n.node_id: n.name for n in store.list_nodes() if n.alive and n.node_id}
        for nid in set(self._actors) - set(nodes):
            self._kill(nid)
        refs: dict[Any, str] = {}
        for nid, name in nodes.items():
            ref = self._waiting.get(nid)
            if ref is None:
                ref = self._actor(nid).sample.remote(name)
            refs[ref] = nid
        if not refs:
            return 0
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        for ref in pending:
            nid = refs[ref]
            if self._waiting.get(nid) is ref:
                log.info("node sample of %s: no answer in two passes; restarting its sampler",
                         nodes[nid])
                self._kill(nid)
            else:
                self._waiting[nid] = ref
        rows = []
        for ref in ready:
            nid = refs[ref]
            self._waiting.pop(nid, None)
            try:
                rows.append(ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - one node's failure skips that node only
                log.info("node sample of %s failed: %s", nodes[nid], exc)
                self._kill(nid)
        store.add_node_usage(rows)
        store.prune_node_usage(before=time.time() - retention_s)
        return len(rows)

    def pids(self) -> dict[str, int]:
        """{node id: the process id of its sampler}."""
        nids = list(self._actors)
        pids = ray.get([self._actors[nid].pid.remote() for nid in nids], timeout=30)
        return dict(zip(nids, pids, strict=True))

    def close(self) -> None:
        for nid in list(self._actors):
            self._kill(nid)

    def _actor(self, nid: str) -> Any:
        actor = self._actors.get(nid)
        if actor is None:
            actor = self._actors[nid] = _RemoteSampler.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
        return actor

    def _kill(self, nid: str) -> None:
        self._waiting.pop(nid, None)
        actor = self._actors.pop(nid, None)
        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
