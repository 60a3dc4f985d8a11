"""`meshyard topo parse | labels | show`: topology tools for operators and tests.

    meshyard topo parse topo.txt --json      # {"gpus": [...], "nics": [...], "links": [...]}
    ray start --address ... --labels "$(meshyard topo labels)"
    meshyard topo show --cluster examples/clusters/mixed_fragmented.yaml
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from api.cli.app import app
from orchestrator.text.ansi import strip_ansi
from orchestrator.text.ranges import format_ranges
from orchestrator.topology.declared import cluster_to_dict, load_cluster_file
from orchestrator.topology.discovery import discover_local_node
from orchestrator.topology.labels import (
    levels_from_node_labels,
    parse_labels_text,
    to_ray_labels_arg,
)
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology
from orchestrator.topology.nccl_xml import parse_nccl_topo_xml
from orchestrator.topology.nvidia_smi import parse_topo_matrix
from orchestrator.topology.serialize import node_topology_to_dict

topo_app = typer.Typer(no_args_is_help=True, help="Topology: parse, labels, show.")
app.add_typer(topo_app, name="topo")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _ranges(ids: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5'."""
    return format_ranges(ids, empty="-")


def describe_node(topo: NodeTopology) -> list[str]:
    """A few readable lines: GPUs, link classes, NVLink groups, NICs with their GPUs."""
    counts = Counter(topo.links.values())
    links = " ".join(f"{k}x{v}" for k, v in sorted(counts.items())) or "-"
    groups = " ".join("{" + _ranges(sorted(g)) + "}" for g in topo.nvlink_components()
                      if len(g) > 1) or "none"
    lines = [f"{len(topo.gpus)} GPUs  links {links}  NVLink groups {groups}"]
    for g in topo.gpus:
        bits = [f"GPU{g.index}"]
        if g.cpu_affinity:
            bits.append(f"cpus {g.cpu_affinity}")
        if g.numa_affinity or g.numa_node is not None:
            bits.append(f"numa {g.numa_affinity or g.numa_node}")
        nic = topo.nearest_nic(g.index)
        if nic:
            bits.append(f"nic {nic} ({topo.gpu_nic_links.get((g.index, nic), '?')})")
        if g.nvlink_domain:
            bits.append(f"domain {g.nvlink_domain}")
        lines.append("  " + "  ".join(bits))
    for n in topo.nics:
        extra = f"  {n.rate_gbps:g} Gb/s {n.state or ''}" if n.rate_gbps else ""
        lines.append(f"  {n.name}: near GPUs {_ranges(n.nearest_gpus)}{extra}")
    return lines


@topo_app.command("parse")
def parse(
    file: Annotated[str, typer.Argument(
        help="`nvidia-smi topo -m` output, or an NCCL topology XML; '-' for stdin.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Parse `nvidia-smi topo -m` text (one link per GPU pair, types exactly as printed)."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
        is_xml = strip_ansi(text).lstrip().startswith("<")
        topo = parse_nccl_topo_xml(text) if is_xml else parse_topo_matrix(text)
    except (OSError, ValueError) as exc:
        raise _fail(f"{file}: {exc}") from exc
    if as_json:
        typer.echo(json.dumps(node_topology_to_dict(topo), indent=2))
    else:
        typer.echo("\n".join(describe_node(topo)))


@topo_app.command("labels")
def labels(
    labels_file: Annotated[Path | None, typer.Option(
        "--labels-file", help="Node labels (k=v lines, downward-API `k=\"v\"`, or k: v).")] = None,
    label: Annotated[list[str] | None, typer.Option(
        "--label", help="Extra label k=v (repeatable); Kubernetes keys are mapped.")] = None,
    env_labels: Annotated[str | None, typer.Option(
        "--env-labels", envvar="MESHYARD_NODE_LABELS",
        help="k=v,k=v from the environment [env MESHYARD_NODE_LABELS].")] = None,
    node_name: Annotated[str | None, typer.Option(
        "--node-name", help="Add meshyard.io/node=NAME: the node's name in a declared "
        "cluster file, so the scheduler joins this Ray node to it.")] = None,
    discover: Annotated[bool, typer.Option(
        "--discover/--no-discover", help="Add levels found on this node (NVML clique).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the levels as JSON.")] = False,
) -> None:
    """Print the `ray start --labels` string for this node's topology levels."""
    raw: dict[str, str] = {}
    try:
        if labels_file is not None:
            raw.update(parse_labels_text(labels_file.read_text()))
        if env_labels:
            raw.update(parse_labels_text(env_labels))
        for item in label or []:
            raw.update(parse_labels_text(item))
    except (OSError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    levels = dict(discover_local_node().labels) if discover else {}
    levels.update(levels_from_node_labels(raw))  # the operator's word wins over discovery
    try:
        arg = to_ray_labels_arg(levels, node_name=node_name)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(json.dumps(levels, indent=2) if as_json else arg)


def _tree(cluster: ClusterTopology) -> list[str]:
    total = sum(len(n.topology.gpus) for n in cluster.nodes)
    free = sum(len(n.free_gpus) for n in cluster.nodes)
    head = (f"cluster: {len(cluster.nodes)} nodes, {total} GPUs ({free} free); levels "
            f"(coarse to fine): {' > '.join(reversed(cluster.levels)) or '(flat)'}")
    lines = [head]
    previous: tuple[str, ...] = ()
    coarse = tuple(reversed(cluster.levels))
    for node in sorted(cluster.nodes, key=lambda n: (cluster.path(n), n.name)):
        path = cluster.path(node)
        same = 0
        while same < len(path) and same < len(previous) and path[same] == previous[same]:
            same += 1
        for depth in range(same, len(path)):
            lines.append("  " * depth + f"{coarse[depth]} {path[depth] or '?'}")
        lines.extend(_node_lines(node, depth=len(path)))
        previous = path
    return lines


def _node_lines(node: ClusterNode, *, depth: int) -> list[str]:
    pad = "  " * depth
    busy = f", busy {_ranges(sorted(node.busy_gpus))}" if node.busy_gpus else ""
    desc = describe_node(node.topology)
    ident = f" [{node.node_id}]" if node.node_id else ""
    first = f"{pad}{node.name}{ident}: free {len(node.free_gpus)}/{len(node.topology.gpus)}{busy}"
    return [first, f"{pad}  {desc[0]}"]


@topo_app.command("show")
def show(
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", help="Declared cluster file (YAML); default: discover this node.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a cluster as a tree along its levels, or this node's discovered topology."""
    if cluster is None:
        found = discover_local_node()
        if as_json:
            typer.echo(json.dumps(found.to_dict(), indent=2))
            return
        typer.echo(f"{found.hostname}: sources {', '.join(found.sources) or 'none'}")
        typer.echo("\n".join(describe_node(found.topology)))
        for err in found.errors:
            typer.echo(f"note: {err}")
        return
    try:
        topo = load_cluster_file(cluster)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(json.dumps(cluster_to_dict(topo), indent=2) if as_json else "\n".join(_tree(topo)))
