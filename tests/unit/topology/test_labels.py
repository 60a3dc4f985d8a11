"""Kubernetes / cloud labels → meshyard levels → `ray start --labels`."""

import doctest

import pytest

from orchestrator.topology import labels as labels_mod
from orchestrator.topology.labels import (
    cluster_levels,
    levels_from_node_labels,
    nvlink_domain_of,
    parse_labels_text,
    sanitize_label_value,
    to_ray_labels_arg,
)
from orchestrator.topology.model import Gpu, NodeTopology


def test_docstring_examples():
    assert doctest.testmod(labels_mod).failed == 0


@pytest.mark.parametrize("k8s, want", [
    ({"nvidia.com/gpu.clique": "6f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.32766",
      "network.topology.nvidia.com/accelerator": "nvl1",
      "network.topology.nvidia.com/block": "s1", "network.topology.nvidia.com/spine": "s2",
      "network.topology.nvidia.com/datacenter": "s3", "kubernetes.io/hostname": "n1"},
     {"nvlink_domain": "6f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.32766", "leaf": "s1",
      "spine": "s2", "datacenter": "s3"}),
    ({"cloud.google.com/gce-topology-block": "b1", "cloud.google.com/gce-topology-subblock": "sb2",
      "cloud.google.com/gce-topology-host": "h3"},
     {"host": "h3", "subblock": "sb2", "block": "b1"}),
    ({"topology.k8s.aws/network-node-layer-1": "nn-top", "topology.k8s.aws/network-node-layer-2":
      "nn-mid", "topology.k8s.aws/network-node-layer-3": "nn-leaf"},
     {"leaf": "nn-leaf", "spine": "nn-mid", "core": "nn-top"}),
    ({"topology.kubernetes.io/network-level-1": "S1", "topology.kubernetes.io/network-level-2":
      "S2"}, {"leaf": "S1", "spine": "S2"}),
    ({"network.topology.nvidia.com/accelerator": "nvl1", "meshyard.io/leaf": "override",
      "network.topology.nvidia.com/block": "s1", "meshyard.io/pod": "p7"},
     {"nvlink_domain": "nvl1", "leaf": "override", "pod": "p7"}),
    ({"leaf": "l0", "app": "x", "meshyard.io/node": "dgx-a1"}, {"leaf": "l0"}),
    ({}, {}),
])
def test_levels_from_node_labels(k8s, want):
    got = levels_from_node_labels(k8s)
    assert got == want and list(got) == list(want)  # order: finest first


def test_cluster_levels_orders_fine_to_coarse():
    assert cluster_levels([{"spine": "a", "leaf": "b"}, {"nvlink_domain": "x", "zz": "1"},
                           {"block": "q"}]) == ("nvlink_domain", "block", "leaf", "spine", "zz")


def test_ray_labels_string_is_accepted_by_ray():
    from ray._private.label_utils import parse_node_labels_string  # the real parser

    levels = {"spine": "spine/0", "leaf": "leaf a", "nvlink_domain": "6f1e.32766"}
    arg = to_ray_labels_arg(levels)
    assert arg == "nvlink_domain=6f1e.32766,leaf=leaf-a,spine=spine-0"
    assert parse_node_labels_string(arg) == {"nvlink_domain": "6f1e.32766", "leaf": "leaf-a",
                                             "spine": "spine-0"}
    assert to_ray_labels_arg({}) == ""
    named = to_ray_labels_arg({"leaf": "l0"}, node_name="dgx a1")
    assert parse_node_labels_string(named) == {"meshyard.io/node": "dgx-a1", "leaf": "l0"}
    with pytest.raises(ValueError, match="not a valid Ray label key"):
        to_ray_labels_arg({"bad key": "v"})


def test_sanitize():
    assert sanitize_label_value("-a b/c_") == "a-b-c"
    assert len(sanitize_label_value("x" * 100)) == 63
    assert sanitize_label_value("///") == ""


def test_parse_labels_text_formats():
    assert parse_labels_text("leaf=l0,spine=s0") == {"leaf": "l0", "spine": "s0"}
    downward = 'topology.k8s.aws/network-node-layer-3="nn-1"\napp="x"\n# comment\n'
    assert parse_labels_text(downward) == {"topology.k8s.aws/network-node-layer-3": "nn-1",
                                           "app": "x"}
    assert parse_labels_text("a: 1\nb: 2") == {"a": "1", "b": "2"}
    assert parse_labels_text("") == {}
    with pytest.raises(ValueError, match="is not key=value"):
        parse_labels_text("justaword")


def test_nvlink_domain_of():
    same = NodeTopology(gpus=tuple(Gpu(index=i, fabric_cluster_uuid="u", fabric_clique_id=3)
                                   for i in range(4)))
    assert nvlink_domain_of(same) == "u.3"
    mixed = NodeTopology(gpus=(Gpu(index=0, fabric_cluster_uuid="u", fabric_clique_id=3),
                               Gpu(index=1)))
    assert nvlink_domain_of(mixed) is None
    assert nvlink_domain_of(NodeTopology(gpus=())) is None
