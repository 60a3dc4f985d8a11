"""Node utilisation samplers on the package's simulated cluster: one long-lived actor per node
answers every sample (no new process per sample), a sampler that dies or stops answering is
replaced, and close() ends them all."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from orchestrator.runtime.node_sampling import NodeSamplers
from orchestrator.runtime.nodes import TopologySource, register_nodes
from orchestrator.store.repo import Store
from tests.integration.runtime.conftest import write_cluster_file
from tests.support.processes import gone


@pytest.mark.slow
def test_one_sampler_per_node_answers_every_sample_and_a_broken_one_is_replaced(
        ray_connected, store: Store, tmp_path: Path) -> None:
    register_nodes(store, TopologySource(cluster_file=write_cluster_file(tmp_path / "c.yaml")))
    live = {n.node_id: n.name for n in store.list_nodes() if n.alive}
    assert sorted(live.values())[:3] == ["c1", "n1", "n2"] and len(live) == 4  # and the head
    samplers = NodeSamplers()
    try:
        assert samplers.sample(store, timeout_s=120) == len(live)  # waits for the actors' start
        first = samplers.pids()
        assert set(first) == set(live) and len(set(first.values())) == len(live)
        for _ in range(3):
            assert samplers.sample(store, timeout_s=30) == len(live)
        assert samplers.pids() == first  # the same processes, no new one per sample
        rows = store.list_node_usage()
        assert {r.node for r in rows} == set(live.values())
        assert all(0 <= (r.cpu_percent or 0) <= 100 and r.mem_total_bytes for r in rows)

        # A sampler killed under the runtime: that node's sample fails, the next is answered
        # by a new actor.
        n1 = next(nid for nid, name in live.items() if name == "n1")
        os.kill(first[n1], signal.SIGKILL)
        assert gone({first[n1]})
        assert samplers.sample(store, timeout_s=30) == len(live) - 1
        assert samplers.sample(store, timeout_s=60) == len(live)
        second = samplers.pids()
        assert second[n1] != first[n1]
        assert {k: v for k, v in second.items() if k != n1} == \
            {k: v for k, v in first.items() if k != n1}

        # A sampler that stops answering (stopped, as by a hung NVML call) is waited for one
        # more pass, then killed and replaced.
        n2 = next(nid for nid, name in live.items() if name == "n2")
        os.kill(second[n2], signal.SIGSTOP)
        assert samplers.sample(store, timeout_s=2) == len(live) - 1
        assert samplers.sample(store, timeout_s=2) == len(live) - 1
        assert gone({second[n2]})
        assert samplers.sample(store, timeout_s=60) == len(live)
        third = samplers.pids()
        assert third[n2] not in (second[n2], first[n2])
    finally:
        with contextlib.suppress(Exception):
            os.kill(second[n2], signal.SIGCONT)  # lets it die if an earlier step failed
        samplers.close()
    assert samplers.pids() == {}
    assert gone(set(third.values()))
