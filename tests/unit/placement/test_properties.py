"""Property tests: the solver against a brute-force search on random clusters of <= 16 GPUs."""

from __future__ import annotations

from itertools import combinations
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.mesh import MeshShape
from orchestrator.placement.failure import FailureReason, PlacementFailure
from orchestrator.placement.solver import Constraints, Placement, solve
from orchestrator.topology.model import ClusterTopology
from tests.unit.placement.clusters import cluster, dgx1, islands, nvswitch, pcie

Slot = tuple[str, int]


def domain_of(c: ClusterTopology, slot: Slot, tp_within: str) -> Any:
    """The TP domain of a GPU, written out independently of the solver."""
    node = c.node(slot[0])
    if tp_within == "node":
        return node.name
    label = node.labels.get("nvlink_domain") if "nvlink_domain" in c.levels else None
    if label:  # levels nest: the same clique label under two leaves is two domains
        return ("nvl", node.labels.get("leaf"), label)
    comp = next(comp for comp in node.topology.nvlink_components() if slot[1] in comp)
    return (node.name, min(comp))


def brute_feasible(c: ClusterTopology, slots: list[Slot], *, groups: int, tp: int,
                   tp_within: str) -> bool:
    """Can `groups` disjoint sets of `tp` GPUs, each inside one TP domain, be drawn from
    `slots`? Exhaustive search over GPU subsets (memoised on the bitmask of GPUs left)."""
    keys = [domain_of(c, s, tp_within) for s in slots]
    memo: dict[tuple[int, int], bool] = {}

    def rec(avail: int, need: int) -> bool:
        if need == 0:
            return True
        if bin(avail).count("1") < need * tp:
            return False
        if (avail, need) in memo:
            return memo[(avail, need)]
        first = (avail & -avail).bit_length() - 1
        rest = avail & ~(1 << first)
        ok = rec(rest, need)  # `first` stays unused
        same = [i for i in range(len(slots)) if rest >> i & 1 and keys[i] == keys[first]]
        for combo in combinations(same, tp - 1):
            if ok:
                break
            mask = rest
            for i in combo:
                mask &= ~(1 << i)
            ok = rec(mask, need - 1)
        memo[(avail, need)] = ok
        return ok

    return rec((1 << len(slots)) - 1, groups)


@st.composite
def clusters(draw: st.DrawFn) -> ClusterTopology:
    budget = 16
    nodes = []
    multi_nvl = draw(st.integers(0, 5)) == 0
    for i in range(draw(st.integers(1, 4))):
        if budget < 1:
            break
        n = draw(st.sampled_from([g for g in (1, 2, 4, 6, 8) if g <= budget]))
        budget -= n
        kinds = ["nvswitch", "pcie"] + (["islands2"] if n % 2 == 0 else []) \
            + (["islands4", "dgx1"] if n == 8 else [])
        kind = draw(st.sampled_from(kinds))
        topo = {"nvswitch": lambda n=n: nvswitch(n), "pcie": lambda n=n: pcie(n),
                "islands2": lambda n=n: islands(n, 2), "islands4": lambda n=n: islands(n, 4),
                "dgx1": dgx1}[kind]()
        busy = draw(st.sets(st.integers(0, n - 1), max_size=n))
        labels = {"leaf": draw(st.sampled_from(["l0", "l1"]))}
        if multi_nvl:
            labels["nvlink_domain"] = draw(st.sampled_from(["d0", "d1"]))
        nodes.append((f"n{i}", topo, labels, sorted(busy)))
    return cluster(nodes, levels=("nvlink_domain", "leaf") if multi_nvl else ("leaf",))


MESHES = [MeshShape(pp=pp, dp_replicate=r, dp_shard=s, tp=tp)
          for pp in (1, 2) for r in (1, 2) for s in (1, 2, 3, 4) for tp in (1, 2, 4, 8)]


def meshes_up_to(n: int) -> st.SearchStrategy[MeshShape]:
    """Meshes that fit the cluster's GPU count (bigger ones are trivially INFEASIBLE)."""
    return st.sampled_from([m for m in MESHES if m.world_size <= max(n, 1)])


def check_placement(c: ClusterTopology, mesh: MeshShape, p: Placement, cons: Constraints) -> None:
    assert [r.rank for r in p.ranks] == list(range(mesh.world_size))  # every rank once
    slots = [(r.node, r.gpu) for r in p.ranks]
    assert len(set(slots)) == len(slots)  # no GPU twice
    for r in p.ranks:
        node = c.node(r.node)
        assert r.gpu in node.free_gpus  # never a busy GPU
        assert r.node not in cons.avoid_nodes
        assert dict(r.coords) == mesh.coords(r.rank)
    if not p.relaxed:
        for group in mesh.groups("tp"):
            assert len({domain_of(c, slots[r], cons.tp_within) for r in group}) == 1


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=clusters(), tp_within=st.sampled_from(["nvlink_domain", "node"]),
       mode=st.sampled_from(["required", "preferred"]), data=st.data())
def test_solver_agrees_with_brute_force(c: ClusterTopology, tp_within: str, mode: str,
                                        data: st.DataObject) -> None:
    mesh = data.draw(meshes_up_to(sum(len(n.topology.gpus) for n in c.nodes)))
    avoid = tuple(data.draw(st.sets(st.sampled_from([n.name for n in c.nodes]), max_size=1)))
    check_against_brute_force(c, mesh, Constraints(tp_within=tp_within, mode=mode,
                                                   avoid_nodes=avoid))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=clusters(), tp_within=st.sampled_from(["nvlink_domain", "node"]),
       mode=st.sampled_from(["required", "preferred"]), data=st.data())
def test_enough_free_gpus_fragmented_or_placed(c: ClusterTopology, tp_within: str, mode: str,
                                               data: st.DataObject) -> None:
    """Biased to the interesting case: enough GPUs are free, TP groups may not fit."""
    free = sum(len(n.free_gpus) for n in c.nodes)
    mesh = data.draw(st.sampled_from([m for m in MESHES if m.tp > 1 and m.world_size <= free]
                                     or [MeshShape()]))
    check_against_brute_force(c, mesh, Constraints(tp_within=tp_within, mode=mode))


def check_against_brute_force(c: ClusterTopology, mesh: MeshShape, cons: Constraints) -> None:
    avoid = cons.avoid_nodes
    tp_within, mode = cons.tp_within, cons.mode
    result = solve(c, mesh, constraints=cons)
    assert solve(c, mesh, constraints=cons) == result  # deterministic

    usable = [n for n in c.nodes if n.name not in avoid]
    free = [(n.name, g) for n in usable for g in n.free_gpus]
    every = [(n.name, g) for n in usable for g in n.topology.gpu_indices]
    args = {"groups": mesh.n_tp_groups, "tp": mesh.tp, "tp_within": tp_within}
    now_ok = brute_feasible(c, free, **args)
    event(f"{'placed' if isinstance(result, Placement) else result.reason.value}"
          f"{' relaxed' if isinstance(result, Placement) and result.relaxed else ''}")
    if isinstance(result, Placement):
        check_placement(c, mesh, result, cons)
    if now_ok:  # the constraint can hold: it must
        assert isinstance(result, Placement) and not result.relaxed
        return
    if mode == "preferred" and len(free) >= mesh.world_size:
        assert isinstance(result, Placement)  # best effort when the GPUs are there
        return
    assert isinstance(result, PlacementFailure)  # failure only when brute force says so
    if not brute_feasible(c, every, **args):
        assert result.reason in (FailureReason.INFEASIBLE, FailureReason.TP_DOMAIN_TOO_SMALL)
        assert not result.retryable
    elif len(free) < mesh.world_size:
        assert result.reason == FailureReason.INSUFFICIENT_FREE
    else:
        assert result.reason == FailureReason.FRAGMENTED
    assert result.message
