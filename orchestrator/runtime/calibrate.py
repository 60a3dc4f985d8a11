"""`meshyard calibrate` as a Ray job: one collective benchmark per topology level.

For each probe of `probes.plan_probes` (inside the best GPU node, then one node pair per switch
level), a placement group pins one bundle per rank to its node (`bundle_label_selector` on
`ray.io/node-id`, as the scheduler does), a `workers.host.calibrate.CalibrationRank` actor runs in
each bundle, rank 0's node address and a free port there form the rendezvous, and every rank
runs the nccl-tests-style sweep. Probes run one after another so they never share links.
What Ray could not place within `reserve_timeout_s`, or a sweep that does not finish within
`timeout_s`, fails with the probe named; the placement group and actors are always removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.placement.snapshot import build_snapshot
from orchestrator.planner.calibration.probes import Probe, intra_link, plan_probes
from orchestrator.planner.calibration.report import build_doc
from orchestrator.runtime.nodes import read_ray_nodes
from orchestrator.topology.model import ClusterTopology
from workers.host.calibrate import CalibrationRank, run

log = logging.getLogger("meshyard.calibrate")


class CalibrationError(RuntimeError):
    """A probe could not be placed or did not finish."""


def calibrate_local(*, nproc: int, out: Path, min_bytes: int, max_bytes: int,
                    iters: int) -> list[dict[str, Any]]:
    """`meshyard calibrate --local`: `nproc` ranks on this host, no Ray; rank 0's rows."""
    return run(nproc=nproc, out=out, min_bytes=min_bytes, max_bytes=max_bytes, iters=iters)


def calibrate_cluster(*, ray_address: str | None, declared: ClusterTopology | None,
                      cfg: dict[str, Any], cpus_per_rank: float, max_ranks: int,
                      timeout_s: float,
                      on_probe: Callable[[Probe], None] | None = None) -> dict[str, Any]:
    """`meshyard calibrate`: connects to the Ray at `ray_address` (a local one started for the
    run when None), runs every probe and shuts down what it started."""
    from orchestrator.runtime.service import connect_ray

    started = connect_ray(ray_address)
    try:
        return calibrate_on_ray(declared=declared, cfg=cfg, cpus_per_rank=cpus_per_rank,
                                max_ranks=max_ranks, timeout_s=timeout_s, on_probe=on_probe)
    finally:
        if started:
            ray.shutdown()


def calibrate_on_ray(*, declared: ClusterTopology | None, cfg: dict[str, Any],
                     cpus_per_rank: float = 0.5, max_ranks: int = 8,
                     reserve_timeout_s: float = 60.0, timeout_s: float = 900.0,
                     on_probe: Callable[[Probe], None] | None = None) -> dict[str, Any]:
    """Runs every probe on the connected Ray cluster; returns calibration.json's document.

    `cfg`: the sweep's primitives, min_bytes, max_bytes, warmup and iters
    (``workers.host.calibrate.measure``). Ray must be initialised.
    """
    snap = build_snapshot(ray_nodes=read_ray_nodes(), topology=declared)
    probes = plan_probes(snap.cluster, free_cpus=snap.free_cpus, cpus_per_rank=cpus_per_rank,
                         max_ranks=max_ranks)
    measured, backends = [], set()
    for probe in probes:
        if on_probe is not None:
            on_probe(probe)
        got = _run_probe(snap.cluster, probe, cfg, cpus_per_rank=cpus_per_rank,
                         reserve_timeout_s=reserve_timeout_s, timeout_s=timeout_s)
        backends.add(got.pop("backend"))
        measured.append(got)
    return build_doc(measured, mode="ray", backend="+".join(sorted(backends)))


def _run_probe(cluster: ClusterTopology, probe: Probe, cfg: dict[str, Any], *,
               cpus_per_rank: float, reserve_timeout_s: float,
               timeout_s: float) -> dict[str, Any]:
    what = f"probe {probe.level} on {', '.join(sorted(set(probe.nodes)))}"
    res: dict[str, float] = {"CPU": cpus_per_rank, **({"GPU": 1} if probe.gpu else {})}
    node_ids = [cluster.node(n).node_id for n in probe.nodes]
    pg = placement_group([dict(res) for _ in probe.nodes],
                         bundle_label_selector=[{"ray.io/node-id": nid} for nid in node_ids])
    actors: list[Any] = []
    try:
        ready, _ = ray.wait([pg.ready()], timeout=reserve_timeout_s)
        if not ready:
            raise CalibrationError(
                f"{what}: Ray could not reserve {probe.ranks} x {res} within "
                f"{reserve_timeout_s:g} s; free those resources (or lower --max-ranks) and retry")
        remote = ray.remote(CalibrationRank)
        actors = [remote.options(  # type: ignore[attr-defined]
            num_cpus=cpus_per_rank, num_gpus=1 if probe.gpu else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i)).remote() for i in range(probe.ranks)]
        infos = ray.get([a.info.remote() for a in actors], timeout=reserve_timeout_s)
        port = ray.get(actors[0].free_port.remote(), timeout=reserve_timeout_s)
        n = probe.ranks
        refs = [a.run.remote(i, n, infos[0]["ip"], port, cfg) for i, a in enumerate(actors)]
        try:
            rows = ray.get(refs, timeout=timeout_s)[0]
        except ray.exceptions.GetTimeoutError:
            raise CalibrationError(f"{what}: the sweep did not finish in {timeout_s:g} s; "
                                   "lower --max-bytes or --iters") from None
        except ray.exceptions.RayError as exc:
            raise CalibrationError(f"{what}: a rank failed: {exc}") from None
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)
    if probe.link_class is not None:
        link_class, kind = probe.link_class, None
    else:
        gpu_ids = [g for info in infos for g in info["gpu_ids"]]
        link_class, kind = intra_link(cluster, probe.nodes[0], gpu_ids)
    log.info("%s: %d ranks, class %s", what, n, link_class)
    return {"level": probe.level, "span": probe.span, "link_class": link_class, "kind": kind,
            "nodes": list(probe.nodes), "rows": rows,
            "backend": "nccl" if infos[0]["cuda"] else "gloo"}
