"""The pre-flight verdict (orchestrator/preflight/verdict.py) and its restart policy."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import Reason
from orchestrator.mesh import MeshShape
from orchestrator.placement.links import LinkFigures, LinkModel
from orchestrator.planner.calibration.figures import figures_from
from orchestrator.preflight.verdict import (
    ExpectedLink,
    Site,
    culprits_of,
    expected_links,
    failure_message,
    slow_links,
)
from orchestrator.runtime.policy import MAX_PREFLIGHT_RESTARTS, Outcome, restart_decision
from tests.unit.placement.clusters import cluster, islands, nvswitch

MB = 1_000_000


def _t(rank: int, src: int, p2p_s: float, expected: dict[str, ExpectedLink] | None = None,
       **groups: float) -> dict[str, object]:
    return {"rank": rank, "bytes": MB, "p2p": {"src": src, "s": p2p_s},
            "groups": {k.replace("_", ":", 1).replace("_", ","): v for k, v in groups.items()},
            "expected": {k: v.to_dict() for k, v in (expected or {}).items()}}


@pytest.mark.parametrize(("timings", "expected"), [
    # rank 1's send starts 0.5 s late: its receiver (rank 2) sees it; 1 is the culprit
    ([_t(0, 3, 0.001), _t(1, 0, 0.001), _t(2, 1, 0.5), _t(3, 2, 0.001)], [("p2p", (1, 2))]),
    # all equal: nothing
    ([_t(0, 1, 0.002), _t(1, 0, 0.002)], []),
    # 10x slower but only by 9 ms: scheduling noise on a small message, not a bad link
    ([_t(0, 2, 0.001), _t(1, 0, 0.010), _t(2, 1, 0.001)], []),
    # a tp group far slower than the other tp group
    ([_t(0, 3, 0.001, tp_0_1=0.4), _t(1, 0, 0.001, tp_0_1=0.4),
      _t(2, 1, 0.001, tp_2_3=0.002), _t(3, 2, 0.001, tp_2_3=0.002)],
     [("all_reduce", (0, 1))]),
    # one group of a dimension: nothing to compare with
    ([_t(0, 1, 0.001, tp_0_1=0.9), _t(1, 0, 0.001, tp_0_1=0.9)], []),
])
def test_slow_links(timings: list[dict[str, object]],
                    expected: list[tuple[str, tuple[int, ...]]]) -> None:
    got = slow_links(timings, min_ratio=0.1)
    assert [(s.kind, s.ranks) for s in got] == expected
    if got:
        msg = failure_message(got)
        assert culprits_of(msg) == sorted({r for s in got for r in s.culprits})
        assert "GB/s" in msg and "median of its peers" in msg


def test_preflight_failures_restart_without_counting_max_failures() -> None:
    d = restart_decision(attempt=1, failed=0, preflight_failed=1, max_failures=0,
                         reason=Reason.PREFLIGHT_FAILED, message="p2p 1->0 slow")
    assert d.outcome == Outcome.RESTART and "not counted" in d.message
    last = restart_decision(attempt=5, failed=0, preflight_failed=MAX_PREFLIGHT_RESTARTS + 1,
                            max_failures=3, reason=Reason.PREFLIGHT_FAILED, message="x")
    assert last.outcome == Outcome.FAIL
    assert culprits_of("any other error") == []


NV = ExpectedLink("NV18", 450.0, 2.0, ("n0",))
IB = ExpectedLink("IB@leaf", 50.0, 5.0, ("n0", "n1"))
LOOP = ExpectedLink("gloo-loopback", 0.25, 100.0, ("n0",))
NCCL = 0.0005  # orchestrator.preflight.verdict.MIN_EXCESS_S["nccl"]


@pytest.mark.parametrize(("timings", "min_excess_s", "expected"), [
    # NCCL, one tp pair over NVLink at 1 GB/s (1 ms for 1 MB): below 0.1 x 450 GB/s and
    # 1 ms over the ~4 us expected; alone of its kind, so only the figure can catch it
    ([_t(0, 1, 2e-5, {"tp:0,1": NV}, tp_0_1=0.001), _t(1, 0, 2e-5, {"tp:0,1": NV},
                                                      tp_0_1=0.001)],
     NCCL, [("all_reduce", (0, 1), "NV18")]),
    # the same pair at 300 GB/s: healthy
    ([_t(0, 1, 2e-5, {"tp:0,1": NV}, tp_0_1=3.4e-6), _t(1, 0, 2e-5, {"tp:0,1": NV},
                                                        tp_0_1=3.4e-6)], NCCL, []),
    # every p2p pair across IB equally slow (0.5 GB/s): the peers agree, the figure does not
    ([_t(0, 1, 0.002, {"p2p:1,0": IB}), _t(1, 0, 0.002, {"p2p:0,1": IB})],
     NCCL, [("p2p", (1, 0), "IB@leaf"), ("p2p", (0, 1), "IB@leaf")]),
    # below 0.1 x the figure but by less than the excess floor: noise on a tiny message
    ([_t(0, 1, 0.0003, {"p2p:1,0": IB}), _t(1, 0, 2.5e-5, {"p2p:0,1": IB})], NCCL, []),
    # gloo on one host, a healthy 2-rank gang at its slowest measured here (0.09 GB/s)
    ([_t(0, 1, 0.011, {"p2p:1,0": LOOP}, world_0_1=0.011),
      _t(1, 0, 0.011, {"p2p:0,1": LOOP}, world_0_1=0.011)], 0.05, []),
    # gloo on a loaded host (59 ms per 1 MiB send, measured at load 20): every pair equally
    # slow, 14x under the figure but within its margin, and the peers agree: healthy
    ([_t(0, 2, 0.059, {"p2p:2,0": LOOP}), _t(1, 0, 0.059, {"p2p:0,1": LOOP}),
      _t(2, 1, 0.059, {"p2p:1,2": LOOP})], 0.05, []),
    # gloo, rank 1's sends 0.5 s late: below the loopback figure and its peers
    ([_t(0, 2, 0.001, {"p2p:2,0": LOOP}), _t(1, 0, 0.001, {"p2p:0,1": LOOP}),
      _t(2, 1, 0.5, {"p2p:1,2": LOOP})], 0.05, [("p2p", (1, 2), "gloo-loopback")]),
    # no figure passed (an older controller): the peers alone decide, as before
    ([_t(0, 2, 0.001), _t(1, 0, 0.001), _t(2, 1, 0.5)], 0.05, [("p2p", (1, 2), None)]),
])
def test_slow_links_against_expected_figures(
        timings: list[dict[str, object]], min_excess_s: float,
        expected: list[tuple[str, tuple[int, ...], str | None]]) -> None:
    got = slow_links(timings, min_ratio=0.1, min_excess_s=min_excess_s,
                     min_excess_vs_figure_s=0.5 if min_excess_s == 0.05 else None)
    assert [(s.kind, s.ranks, s.expected.link if s.expected else None) for s in got] == expected
    for s in got:
        if s.expected is not None:
            text = s.describe()
            assert s.expected.link in text and "expected" in text
            assert all(n in text for n in s.expected.nodes)


def test_failure_message_names_ranks_nodes_link_and_both_figures() -> None:
    (slow,) = slow_links([_t(0, 1, 2e-5, {"tp:0,1": NV}, tp_0_1=0.001),
                          _t(1, 0, 2e-5, {"tp:0,1": NV}, tp_0_1=0.001)],
                         min_ratio=0.1, min_excess_s=NCCL)
    msg = failure_message([slow])
    assert msg.startswith("pre-flight check failed: all_reduce on tp group [0, 1] over NV18 "
                          "(n0): 1 GB/s, expected ")
    assert slow.expected_gbps is not None and 100 < slow.expected_gbps < 450  # alpha counts
    assert culprits_of(msg) == [0, 1]


def test_expected_links_follow_the_topology_on_gpus() -> None:
    topo = cluster([("n0", islands(8, 4), {"leaf": "l0"}, []),
                    ("n1", nvswitch(), {"leaf": "l0"}, [])])
    model = LinkModel(topo, LinkFigures())
    # tp=2 inside n0's island 0-1; dp pairs ranks on n0 with ranks on n1
    sites = {0: Site("n0", 0, "a"), 1: Site("n0", 1, "a"), 2: Site("n1", 0, "b"),
             3: Site("n1", 1, "b")}
    got = expected_links(mesh=MeshShape(dp_shard=2, tp=2), sites=sites, backend="nccl",
                         cluster_links=model)
    assert got[0]["tp:0,1"].link == "NV12" and got[0]["tp:0,1"].gbs == 300.0
    assert got[2]["tp:2,3"].link == "NV18"
    assert got[0]["dp_shard:0,2"].link.startswith("IB@") and got[0]["dp_shard:0,2"].gbs == 50.0
    assert got[0]["dp_shard:0,2"].nodes == ("n0", "n1")
    assert got[2]["p2p:1,2"].link.startswith("IB@") and got[1]["p2p:0,1"].link == "NV12"
    assert set(got[3]) == {"world:0,1,2,3", "tp:2,3", "dp_shard:1,3", "p2p:2,3"}
    # a GPU the topology does not know: no figure, the peers alone decide
    odd = expected_links(mesh=MeshShape(dp_shard=2), backend="nccl", cluster_links=model,
                         sites={0: Site("n0", 0, "a"), 1: Site("nX", 0, "c")})
    assert odd == {0: {}, 1: {}}


def test_expected_links_on_cpus_use_the_gloo_figures_calibrated_or_default() -> None:
    sites = {0: Site("n0", None, "127.0.0.1"), 1: Site("n1", None, "127.0.0.1")}
    mesh = MeshShape(dp_shard=2)
    default = expected_links(mesh=mesh, sites=sites, backend="gloo")
    assert default[0]["p2p:1,0"] == ExpectedLink("gloo-loopback", 0.25, 100.0, ("n0", "n1"))
    doc = {"backend": "gloo", "links": {
        "pcie": {"gbs": 1.7, "alpha_us": 40.0, "kind": None, "span": 0},
        "network": {"gbs": 0.9, "alpha_us": 80.0, "span": 1}}}
    calibrated = figures_from(doc)
    got = expected_links(mesh=mesh, sites=sites, backend="gloo", figures=calibrated)
    assert (got[1]["world:0,1"].gbs, got[1]["world:0,1"].alpha_us) == (1.7, 40.0)
    apart = {0: Site("n0", None, "10.0.0.1"), 1: Site("n1", None, "10.0.0.2")}
    tcp = expected_links(mesh=mesh, sites=apart, backend="gloo", figures=calibrated)
    assert tcp[0]["p2p:1,0"].link == "gloo-tcp" and tcp[0]["p2p:1,0"].gbs == 0.9
    # an NCCL calibration leaves the gloo figures at their defaults
    nccl = figures_from({**doc, "backend": "nccl"})
    assert nccl.gloo_loopback_gbs == LinkFigures().gloo_loopback_gbs
