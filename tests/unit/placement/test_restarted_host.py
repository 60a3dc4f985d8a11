"""A host whose Ray restarts joins as a new Ray node while Ray still lists its old incarnation
alive (about a minute of missed heartbeats): the snapshot keeps one node per name, the newest,
instead of refusing the cluster for a duplicate name (which failed a control plane's start)."""

from __future__ import annotations

import doctest

import pytest

from orchestrator.placement import snapshot
from orchestrator.placement.snapshot import (
    NODE_NAME_LABEL,
    RayNode,
    build_snapshot,
    newest_per_name,
)


def _node(node_id: str, name: str | None, ip: str = "198.18.0.13") -> RayNode:
    labels = {NODE_NAME_LABEL: name} if name else {}
    return RayNode(node_id=node_id, ip=ip, labels=labels, gpus=0, cpus=2.0, free_gpus=0,
                   free_cpus=2.0)


def test_docstring_example() -> None:
    assert doctest.testmod(snapshot).failed == 0


def test_the_same_name_twice_fails_the_snapshot_without_the_filter() -> None:
    with pytest.raises(ValueError, match="duplicate node names"):
        build_snapshot(ray_nodes=[_node("old", "h3"), _node("new", "h3")], topology=None)


def test_the_node_seen_later_is_kept_and_the_old_one_named() -> None:
    nodes = [_node("h1-id", "h1", "198.18.0.11"), _node("old", "h3"), _node("new", "h3")]
    kept, dropped = newest_per_name(nodes, first_seen={"h1-id": 0.0, "old": 1.0, "new": 50.0})
    assert [n.node_id for n in kept] == ["h1-id", "new"]
    assert dropped == [("h3", ["old"])]
    snap = build_snapshot(ray_nodes=kept, topology=None)
    assert sorted(n.name for n in snap.cluster.nodes) == ["h1", "h3"]


def test_seen_at_once_the_store_decides_then_the_larger_id() -> None:
    nodes = [_node("aaa", "h3"), _node("zzz", "h3")]
    seen = {"aaa": 5.0, "zzz": 5.0}  # a control plane that starts while both are listed
    kept, _ = newest_per_name(nodes, first_seen=seen, stored={"h3": "aaa"})
    assert [n.node_id for n in kept] == ["aaa"]
    kept, _ = newest_per_name(nodes, first_seen=seen)
    assert [n.node_id for n in kept] == ["zzz"]


def test_nodes_without_a_name_label_are_all_kept() -> None:
    nodes = [_node("a", None), _node("b", None), _node("c", "h1")]
    kept, dropped = newest_per_name(nodes, first_seen={})
    assert [n.node_id for n in kept] == ["a", "b", "c"] and dropped == []
