"""Name the hardware that wedged communicators share (GPU, node, NVLink domain, switch).

Pure module. Levels are tried most specific first: GPU, node, then the location labels in the
order given (innermost first: nvlink_domain, leaf, spine ...). A value is suspect when every
stuck group has a member on it and no healthy group does; ranks with NCCL errors name their
own GPU and node first, since an IB completion error or a CUDA error is direct evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.watchdog.report import RankLocation, SuspectHardware


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
