"""`meshyard plan` (ranked parallelism plans) and `meshyard calibrate` (collective benchmark).

    meshyard plan --model llama-70b --gpus 64 --global-batch 512
    meshyard plan --layers 24 --d-model 2048 --heads 16 --vocab 50257 --seq-len 2048 \
        --gpus 8 --global-batch 32 --cluster examples/clusters/pcie_boxes.yaml --json
    meshyard calibrate --max-bytes 16MiB                       # Ray job, every topology level
    meshyard calibrate --local --nproc 2 --link-class pcie     # no Ray: local ranks

`plan` without --cluster plans on --gpus GPUs in nodes of --gpus-per-node NVSwitch GPUs.
Both use the link figures of `<data dir>/calibration.json` when `calibrate` stored one.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.app import app
from api.cli.common import DataDirOpt, settings_from
from orchestrator.planner.autoplan import format_table
from orchestrator.planner.calibration.figures import LINK_CLASSES, load_figures, save
from orchestrator.planner.calibration.report import build_doc
from orchestrator.planner.memory import KNOWN_MODELS, ModelShape
from orchestrator.planner.planner import Hardware, PlanningError, PlanRequest, plan
from orchestrator.topology.model import ClusterNode, ClusterTopology, NodeTopology


def _fail(message: str, *, as_json: bool, details: dict[str, Any] | None = None) -> typer.Exit:
    if as_json:
        typer.echo(json.dumps({"error": {**(details or {}), "message": message}}, indent=2))
    else:
        typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _shape(model: str | None, sizes: dict[str, int | None]) -> ModelShape:
    if model is not None:
        if model not in KNOWN_MODELS:
            raise ValueError(f"unknown model {model!r}; use one of {sorted(KNOWN_MODELS)} or "
                             "give --layers --d-model --heads --vocab --seq-len")
        return KNOWN_MODELS[model]
    missing = [k for k in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len")
               if sizes[k] is None]
    if model is None and sizes.get("top_k") is not None and not sizes.get("experts"):
        raise ValueError("--top-k is for MoE models: give --experts too")
    if missing:
        raise ValueError(f"give --model or every size (missing: {', '.join(missing)})")
    return ModelShape(name="model", **{k: v for k, v in sizes.items() if v is not None})


def _uniform_cluster(gpus: int, per_node: int, link: str) -> ClusterTopology:
    nodes = math.ceil(gpus / per_node)
    return ClusterTopology(levels=("leaf", "spine"), nodes=tuple(
        ClusterNode(name=f"node-{i:05d}", topology=NodeTopology.uniform(per_node, link),
                    labels={"leaf": f"leaf-{i // 32}", "spine": f"spine-{i // 512}"})
        for i in range(nodes)))


@app.command("plan")
def plan_cmd(
    model: Annotated[str | None, typer.Option("--model", help=f"One of {sorted(KNOWN_MODELS)}"
                                              )] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="GPUs to use (default: "
                                             "every free GPU of --cluster).")] = None,
    global_batch: Annotated[int, typer.Option("--global-batch", min=1,
                                              help="Sequences per optimizer step.")] = 256,
    layers: Annotated[int | None, typer.Option("--layers", min=1)] = None,
    d_model: Annotated[int | None, typer.Option("--d-model", min=1)] = None,
    heads: Annotated[int | None, typer.Option("--heads", min=1)] = None,
    vocab: Annotated[int | None, typer.Option("--vocab", min=1)] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1)] = None,
    ffn: Annotated[int | None, typer.Option("--ffn", min=1, help="MLP size.")] = None,
    params: Annotated[int | None, typer.Option("--params", min=1, help="Parameter count.")]
    = None,
    experts: Annotated[int | None, typer.Option("--experts", min=2, max=256, help="MoE experts "
                                                "per block: ep is searched too.")] = None,
    moe_top_k: Annotated[int | None, typer.Option("--top-k", min=1, max=8,
                                                  help="MoE: experts per token.")] = None,
    cluster: Annotated[Path | None, typer.Option("--cluster", help="Declared cluster file.")]
    = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1)] = 8,
    intra_node: Annotated[str, typer.Option("--intra-node", help="Link class inside a node "
                                            "without --cluster (NV18, PIX, ...).")] = "NV18",
    memory_gb: Annotated[float, typer.Option("--memory-gb", min=1)] = 80.0,
    tflops: Annotated[float, typer.Option("--tflops", min=1, help="Peak TFLOP/s per GPU.")]
    = 989.0,
    efficiency: Annotated[float, typer.Option("--efficiency", min=0.01, max=1.0)] = 0.4,
    top: Annotated[int, typer.Option("--top", min=1)] = 10,
    solve_top: Annotated[int, typer.Option("--solve-top", min=0, help="Run the placement "
                                           "solver on this many of the best plans.")] = 1,
    data_dir: DataDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Rank (tp, pp, dp, ep, cp, ZeRO, microbatch, checkpointing) plans by estimated step
    time."""
    sizes = {"n_layers": layers, "d_model": d_model, "n_heads": heads, "vocab_size": vocab,
             "seq_len": seq_len, "ffn_dim": ffn, "params": params, "experts": experts,
             "top_k": moe_top_k}
    try:
        shape = _shape(model, sizes)
        if cluster is not None:
            from orchestrator.topology.declared import load_cluster_file
            topo = load_cluster_file(cluster)
        elif gpus is None:
            raise ValueError("give --gpus (or --cluster)")
        else:
            topo = _uniform_cluster(gpus, gpus_per_node, intra_node)
        figures = load_figures(settings_from(data_dir=data_dir).data_dir)
        result = plan(topo, PlanRequest(
            model=shape, global_batch=global_batch, gpus=gpus, top_k=top, solve_top=solve_top,
            hardware=Hardware(memory_gb=memory_gb, peak_tflops=tflops, efficiency=efficiency)),
            figures=figures)
    except (OSError, ValueError, PlanningError) as exc:
        raise _fail(str(exc), as_json=as_json) from None
    if result.no_fit is not None:  # nothing feasible: an error that says what would fit
        raise _fail(result.no_fit.message(), as_json=as_json, details=result.no_fit.as_dict())
    if as_json:
        typer.echo(json.dumps({"result": result.as_dict(), "table": format_table(result)},
                              indent=2))
    else:
        typer.echo(format_table(result, limit=top))


def calibrate_doc(raw: list[dict[str, Any]], *, link_class: str, nproc: int) -> dict[str, Any]:
    """calibration.json of a local run (`--local`): one level, the given link class."""
    return build_doc([{"level": "node", "span": 0, "link_class": link_class, "kind": None,
                       "nodes": ["local"] * nproc, "rows": raw}], mode="local", backend="gloo")


def _run_on_ray(*, settings: Any, cfg: dict[str, Any], max_ranks: int, cpus_per_rank: float,
                timeout_s: float, as_json: bool) -> dict[str, Any]:
    from orchestrator.runtime.calibrate import calibrate_cluster

    declared = None
    if settings.cluster_file:
        from orchestrator.topology.declared import load_cluster_file
        declared = load_cluster_file(settings.cluster_file)

    def say(probe: Any) -> None:
        if not as_json:
            typer.echo(f"probe {probe.level}: {probe.ranks} ranks on "
                       f"{', '.join(sorted(set(probe.nodes)))}"
                       f"{' (GPUs)' if probe.gpu else ' (CPUs)'}")
    return calibrate_cluster(ray_address=settings.ray_address, declared=declared, cfg=cfg,
                             cpus_per_rank=cpus_per_rank, max_ranks=max_ranks,
                             timeout_s=timeout_s, on_probe=say)


@app.command("calibrate")
def calibrate_cmd(
    local: Annotated[bool, typer.Option("--local", help="No Ray: --nproc ranks on this host "
                                        "(torch.multiprocessing), one link class.")] = False,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Ray cluster to measure (default: MESHYARD_RAY_ADDRESS, else "
        "a local Ray started for the run).")] = None,
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", help="Declared topology (default: MESHYARD_CLUSTER_FILE); its levels "
        "choose the node pairs.")] = None,
    max_ranks: Annotated[int, typer.Option("--max-ranks", min=2, help="Ranks of the "
                                           "inside-a-node probe (GPU nodes).")] = 8,
    cpus_per_rank: Annotated[float, typer.Option("--cpus-per-rank", min=0.01)] = 0.5,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds per probe.")]
    = 900.0,
    nproc: Annotated[int, typer.Option("--nproc", min=2, help="Local ranks (--local).")] = 2,
    min_bytes: Annotated[str, typer.Option("--min-bytes")] = "8",
    max_bytes: Annotated[str, typer.Option("--max-bytes", help="Cap (nccl-tests: 1GiB; the "
                                           "default suits a CPU box).")] = "16MiB",
    iters: Annotated[int, typer.Option("--iters", min=2)] = 10,
    link_class: Annotated[str, typer.Option("--link-class", help=f"--local only: which of "
                                            f"{LINK_CLASSES} the local ranks' links stand for "
                                            "(loopback on CPU: pcie).")] = "pcie",
    data_dir: DataDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Benchmark collectives (nccl-tests style) inside a node and across nodes per topology
    level, fit alpha/beta per level and link class, store calibration.json."""
    if link_class not in LINK_CLASSES:
        raise _fail(f"--link-class {link_class!r}: use one of {LINK_CLASSES}", as_json=as_json)
    from orchestrator.planner.calibration.fit import parse_size
    from orchestrator.runtime.calibrate import calibrate_local

    settings = settings_from(data_dir=data_dir, ray_address=ray_address, cluster_file=cluster)
    try:
        lo, hi = parse_size(min_bytes), parse_size(max_bytes)
        if lo > hi:
            raise ValueError(f"--min-bytes {min_bytes} is above --max-bytes {max_bytes}")
        if local:
            with tempfile.TemporaryDirectory() as tmp:
                raw = calibrate_local(nproc=nproc, out=Path(tmp) / "rows.json", min_bytes=lo,
                                    max_bytes=hi, iters=iters)
            doc = calibrate_doc(raw, link_class=link_class, nproc=nproc)
        else:
            from orchestrator.planner.calibration.fit import PRIMITIVES
            cfg = {"primitives": list(PRIMITIVES), "min_bytes": lo, "max_bytes": hi,
                   "warmup": 2, "iters": iters, "timeout_s": timeout}
            doc = _run_on_ray(settings=settings, cfg=cfg, max_ranks=max_ranks,
                              cpus_per_rank=cpus_per_rank, timeout_s=timeout, as_json=as_json)
    except (OSError, ValueError, RuntimeError) as exc:
        raise _fail(str(exc), as_json=as_json) from None
    path = save(settings.data_dir, doc)
    if as_json:
        typer.echo(json.dumps({**doc, "path": str(path)}, indent=2))
        return
    typer.echo(f"{'level':<8} {'primitive':<15} {'bytes':>10} {'time us':>10} "
               f"{'algbw GB/s':>11} {'busbw GB/s':>11}")
    for r in doc["rows"]:
        typer.echo(f"{r['level']:<8} {r['primitive']:<15} {r['bytes']:>10} "
                   f"{r['time_us']:>10.1f} {r['algbw_gbs']:>11.4f} {r['busbw_gbs']:>11.4f}")
    for name, v in doc["levels"].items():
        typer.echo(f"{name} ({v['link_class']}, {v['ranks']} ranks): alpha "
                   f"{v['alpha_us']:.1f} us, {v['gbs']:.3f} GB/s (rms rel error "
                   f"{v['rms_rel_error']:.0%} over {v['rows']} sizes)")
    if "network_upper" in doc:
        u = doc["network_upper"]
        typer.echo(f"per switch level: bandwidth x{u['upper_level_factor']:.2f}, "
                   f"+{u['hop_alpha_us']:.1f} us")
    typer.echo(f"stored {path}")
