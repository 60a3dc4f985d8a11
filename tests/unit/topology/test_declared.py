"""Declared cluster files: the shipped examples, the error messages, the round trip."""

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.topology.declared import (
    cluster_to_dict,
    load_cluster_file,
    parse_cluster_doc,
    pcie_topology,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "clusters"
FIX = ROOT / "tests" / "fixtures" / "topo"


def test_dgx_two_leaves():
    c = load_cluster_file(EXAMPLES / "dgx_h100_two_leaves.yaml")
    assert c.levels == ("leaf", "spine") and len(c.nodes) == 8
    assert {n.labels["leaf"] for n in c.nodes} == {"leaf-a", "leaf-b"}
    n = c.node("dgx-b2")
    assert n.free_gpus == tuple(range(8)) and n.topology.link(0, 7) == "NV18"
    assert c.path(n) == ("spine-0", "leaf-b")
    assert c.max_gpus_per_node == 8


def test_gb200_domains():
    c = load_cluster_file(EXAMPLES / "gb200_nvl72.yaml")
    assert c.levels == ("nvlink_domain", "rack")
    doms: dict[str, int] = {}
    for n in c.nodes:
        doms[n.labels["nvlink_domain"]] = doms.get(n.labels["nvlink_domain"], 0) + len(n.free_gpus)
    assert doms == {"nvl72-a": 72, "nvl72-b": 72 - 12}
    assert c.node("gb200-2-03").busy_gpus == frozenset({0, 1})


def test_pcie_boxes_and_real_matrix():
    c = load_cluster_file(EXAMPLES / "pcie_boxes.yaml")
    p40 = c.node("p40-box").topology
    assert p40.link(0, 1) == "PIX" and p40.link(3, 4) == "PXB"
    assert p40.gpu_nic_links[(0, "mlx5_0")] == "SOC"
    box = c.node("pcie-1").topology
    assert [box.link(0, 1), box.link(0, 2), box.link(0, 4), box.link(6, 7)] == [
        "PIX", "NODE", "SYS", "PIX"]
    assert [g.numa_node for g in box.gpus] == [0] * 4 + [1] * 4


def test_mixed_fragmented_free_gpus():
    c = load_cluster_file(EXAMPLES / "mixed_fragmented.yaml")
    free = {n.name: len(n.free_gpus) for n in c.nodes}
    assert free == {"dgx-h1": 2, "dgx-h2": 6, "dgx-h3": 8, "pcie-1": 7, "dgx1": 4}
    assert c.node("dgx1").topology.link(0, 3) == "NV2"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_round_trip_json_and_pickle(path):
    c = load_cluster_file(path)
    doc = json.loads(json.dumps(cluster_to_dict(c)))
    assert parse_cluster_doc(doc) == c
    assert pickle.loads(pickle.dumps(c)) == c  # Ray ships these between processes


def test_topo_m_file_relative_and_defaults(tmp_path):
    (tmp_path / "m.txt").write_text((FIX / "topo_h100_4gpu_nv6_4nics_sparse_cpu_affinity.txt")
                                    .read_text())
    (tmp_path / "c.yaml").write_text(
        "levels: [leaf]\ndefaults: {labels: {leaf: l0}}\n"
        "nodes:\n  - {name: a, topo_m_file: m.txt, node_id: abc123}\n"
        "  - {name: b, gpus: 2, intra_node: PHB, labels: {leaf: l1}}\n")
    c = load_cluster_file(tmp_path / "c.yaml")
    a, b = c.nodes
    assert a.topology.link(0, 1) == "NV6" and a.key == "abc123" and a.labels["leaf"] == "l0"
    assert b.topology.link(0, 1) == "PHB" and b.labels["leaf"] == "l1" and b.key == "b"


def test_cluster_to_dict_shape():
    c = parse_cluster_doc({"levels": ["leaf"], "nodes": [
        {"name": "n1", "gpus": 2, "labels": {"leaf": "x"}, "busy_gpus": [1]}]})
    d = cluster_to_dict(c)
    assert d["levels"] == ["leaf"]
    node = d["nodes"][0]
    assert (node["name"], node["gpus"], node["busy_gpus"], node["free_gpus"]) == ("n1", 2, [1], [0])
    assert node["topology"]["links"] == [{"a": 0, "b": 1, "type": "NV18"}]


def _node(**kw):
    base = {"name": "n1", "gpus": 8, "labels": {"leaf": "l0"}}
    base.update(kw)
    return {"levels": ["leaf"], "nodes": [base]}


@pytest.mark.parametrize("doc, fragment", [
    ({"nodes": []}, "'levels' is required"),
    ({"levels": ["leaf"], "nodes": []}, "'nodes' must be a non-empty list"),
    ({"levels": ["node"], "nodes": [{}]}, "'node' is implicit"),
    ({"levels": ["leaf", "leaf"], "nodes": [{}]}, "repeat a name"),
    ({"levels": [], "nodes": [{}], "nodez": 1}, "unknown top-level field(s) ['nodez']"),
    (_node(labels={}), "node 'n1' (nodes[0]): labels lack level(s) ['leaf']"),
    (_node(gpus=None), "node 'n1' (nodes[0]): gpus is required when topo_m is absent"),
    (_node(gpus=-1), "gpus must be a non-negative integer"),
    (_node(busy_gpus=[8]), "busy_gpus has 8 but the node's GPUs are 0..7"),
    (_node(busy_gpus="0,1"), "busy_gpus must be a list"),
    (_node(intra_node="infiniband"), "intra_node 'infiniband' is not known; use nvswitch, pcie"),
    (_node(gpu=8), "unknown field(s) ['gpu']"),
    (_node(name=""), "name is required"),
    (_node(topo_m="garbage"), "node 'n1' (nodes[0]): topo_m: no `nvidia-smi topo -m` matrix"),
    (_node(gpus=4, topo_m=(FIX / "topo_h100_8gpu_nv18_no_nics.txt").read_text()),
     "gpus: 4 but its topology has 8 GPUs"),
])
def test_errors_name_the_node_and_fix(doc, fragment):
    with pytest.raises(ValueError) as exc:
        parse_cluster_doc(doc)
    assert fragment in str(exc.value)


def test_duplicate_names_and_file_errors(tmp_path):
    with pytest.raises(ValueError, match="duplicate node names"):
        parse_cluster_doc({"levels": [], "nodes": [{"name": "a", "gpus": 1}] * 2})
    bad = tmp_path / "bad.yaml"
    bad.write_text("levels: [leaf\n")
    with pytest.raises(ValueError, match="is not valid YAML"):
        load_cluster_file(bad)
    with pytest.raises(ValueError, match="cannot read cluster file"):
        load_cluster_file(tmp_path / "missing.yaml")
    (tmp_path / "c.yaml").write_text("levels: []\nnodes: [{name: a, topo_m_file: nope.txt}]\n")
    with pytest.raises(ValueError, match="c.yaml: node 'a' .*cannot read topo_m_file"):
        load_cluster_file(tmp_path / "c.yaml")


def test_pcie_topology_small():
    assert dict(pcie_topology(1).links) == {}
    assert pcie_topology(2).link(0, 1) == "SYS"  # one GPU per socket
    assert pcie_topology(0).gpus == ()


# ------------------------------------------------------------- property: round trip

LINK_CLASSES = ["nvswitch", "pcie", "NV12", "PHB", "SYS"]


@st.composite
def cluster_docs(draw):
    levels = draw(st.lists(st.sampled_from(["nvlink_domain", "leaf", "spine", "block"]),
                           unique=True, max_size=3))
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.integers(0, 8))
        nodes.append({
            "name": f"n{i}", "gpus": gpus, "intra_node": draw(st.sampled_from(LINK_CLASSES)),
            "labels": {lv: f"{lv}-{draw(st.integers(0, 2))}" for lv in levels},
            "busy_gpus": sorted(draw(st.sets(st.integers(0, max(gpus - 1, 0)), max_size=gpus))),
        })
    return {"levels": levels, "nodes": nodes}


@settings(max_examples=60, deadline=None)
@given(cluster_docs())
def test_declared_round_trip_property(doc):
    c = parse_cluster_doc(doc)
    assert [len(n.topology.gpus) for n in c.nodes] == [n["gpus"] for n in doc["nodes"]]
    assert [sorted(n.busy_gpus) for n in c.nodes] == [n["busy_gpus"] for n in doc["nodes"]]
    again = parse_cluster_doc(json.loads(json.dumps(cluster_to_dict(c))))
    assert again == c
    for n in c.nodes:
        assert set(n.free_gpus) | n.busy_gpus == set(range(len(n.topology.gpus)))
        assert len(n.topology.links) == len(n.topology.gpus) * (len(n.topology.gpus) - 1) // 2
