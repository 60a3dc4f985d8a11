"""Name the hardware that wedged communicators share (GPU, node, NVLink domain, switch).

Pure module. Levels are tried most specific first: GPU, node, then the location labels in the
order given (innermost first: nvlink_domain, leaf, spine ...). A value is suspect when every
stuck group has a member on it and no healthy group does; ranks with NCCL errors name their
own GPU and node first, since an IB completion error or a CUDA error is direct evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from orchestrator.watchdog.report import DiagnosisReport, RankLocation, SuspectHardware


def _levels(loc: RankLocation) -> list[tuple[str, str]]:
    out = []
    if loc.node is not None and loc.gpu is not None:
        out.append(("gpu", f"{loc.node}/GPU{loc.gpu}"))
    if loc.node is not None:
        out.append(("node", loc.node))
    out += [(k, str(v)) for k, v in loc.labels.items()]
    return out


def _level_order(locations: Mapping[int, RankLocation]) -> list[str]:
    order = ["gpu", "node"]
    for loc in locations.values():
        for k in loc.labels:
            if k not in order:
                order.append(k)
    return order


def suspect_hardware(*, stuck_groups: Sequence[Sequence[int]],
                     healthy_groups: Sequence[Sequence[int]],
                     error_ranks: Sequence[int],
                     locations: Mapping[int, RankLocation]) -> tuple[SuspectHardware, ...]:
    out: list[SuspectHardware] = []
    for r in sorted(set(error_ranks)):
        loc = locations.get(r)
        if loc is None:
            continue
        for level, name in _levels(loc)[:2]:
            if not any(s.level == level and s.name == name for s in out):
                ranks = tuple(q for q, lq in sorted(locations.items())
                              if (level, name) in _levels(lq))
                out.append(SuspectHardware(level=level, name=name, ranks=ranks,
                                           reason="NCCL errors reported by ranks on it"))
    if not stuck_groups or not locations:
        return tuple(out)
    on: dict[tuple[str, str], set[int]] = {}
    for r, loc in locations.items():
        for key in _levels(loc):
            on.setdefault(key, set()).add(r)
    for level in _level_order(locations):
        found = []
        for (lv, name), there in sorted(on.items()):
            if lv != level:
                continue
            in_stuck = all(there & set(g) for g in stuck_groups)
            in_healthy = sum(1 for g in healthy_groups if there & set(g))
            if in_stuck and in_healthy == 0:
                found.append(SuspectHardware(
                    level=level, name=name, ranks=tuple(sorted(there)),
                    reason=f"shared by all {len(stuck_groups)} stuck group(s) and by no "
                           f"healthy group"))
        # A level where every value qualifies says nothing (one stuck group, no healthy one).
        values = {n for (lv, n) in on if lv == level}
        if found and (len(found) < len(values) or len(values) == 1):
            out.extend(f for f in found if not any(
                s.level == f.level and s.name == f.name for s in out))
            break
    return tuple(out)


def with_driver_errors(report: DiagnosisReport, nodes: Mapping[str, Sequence[Mapping[str, Any]]],
                       locations: Mapping[int, RankLocation]) -> DiagnosisReport:
    """The report with the GPUs whose driver reports errors that take them out of service
    (`nodes`: node name -> `gpu_errors.to_dicts` of its `nvidia-smi -q` and kernel log) named
    first among the suspect hardware, and in the summary. GPUs of the job only: the index is
    nvidia-smi's, which is the GPU id Ray and the topology use."""
    found: list[SuspectHardware] = []
    for node, gpus in sorted(nodes.items()):
        for g in gpus:
            reasons = tuple(str(x) for x in g.get("reasons") or ())
            ranks = tuple(r for r, loc in sorted(locations.items())
                          if loc.node == node and loc.gpu == g.get("index"))
            if not reasons or not ranks:
                continue
            found.append(SuspectHardware(
                level="gpu", name=f"{node}/GPU{g['index']}", ranks=ranks,
                reason=f"driver reports: {'; '.join(reasons)}", driver_errors=reasons))
    if not found:
        return report
    names = {(s.level, s.name) for s in found}
    rest = tuple(s for s in report.suspect_hardware if (s.level, s.name) not in names)
    said = "; ".join(f"{s.name} ({', '.join(s.driver_errors)})" for s in found)
    return replace(report, suspect_hardware=(*found, *rest),
                   summary=f"{report.summary} Driver errors: {said}.",
                   recommendations=(f"Take {', '.join(s.name for s in found)} out of service "
                                    "(meshyard cordons it) and reset or replace it.",
                                    *report.recommendations))
