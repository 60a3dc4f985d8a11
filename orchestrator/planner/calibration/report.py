"""calibration.json's content from measured probes: rows, one alpha-beta fit per topology
level, and the figures the cost model takes from them. Pure module.

    {"version": 2, "mode": "ray", "backend": "gloo", "measured_at": "...", "world_size": 2,
     "levels": {"node":  {"link_class": "nvlink", "span": 0, "alpha_us": .., "gbs": .., ...},
                "leaf":  {"link_class": "network", "span": 1, ...},
                "spine": {"link_class": "network", "span": 2, ...}},
     "links": {"nvlink": {...}, "network": {..., "span": 1}},
     "network_upper": {"upper_level_factor": 0.52, "hop_alpha_us": 3.1, "spans": [1, 2]},
     "rows": [{"primitive": "all_reduce", "n": 2, "bytes": 8, "time_us": ..,
               "algbw_gbs": .., "busbw_gbs": .., "link_class": "nvlink", "level": "node"}]}

`links` holds, per link class, the finest level measured with it (what LinkFigures' class
figure means: NVLink in a node, the network under one leaf switch). With two or more network
levels, `network_upper` is the bandwidth kept per switch level climbed (geometric mean between
the finest and the coarsest) and the latency each level adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from orchestrator.planner.calibration.fit import Row, fit_alpha_beta


def build_doc(measured: Iterable[Mapping[str, Any]], *, mode: str, backend: str) -> dict[str, Any]:
    """`measured`: per probe {"level", "span", "link_class", "kind", "nodes", "rows"} where rows
    are the benchmark's raw {"primitive", "n", "bytes", "seconds"}."""
    levels: dict[str, dict[str, Any]] = {}
    all_rows: list[Row] = []
    world = 0
    for m in measured:
        rows = [Row(r["primitive"], int(r["n"]), int(r["bytes"]), float(r["seconds"]),
                    m["link_class"], m["level"]) for r in m["rows"]]
        fit = fit_alpha_beta(rows)
        ranks = len(m.get("nodes") or ()) or max(r.n for r in rows)
        world = max(world, ranks)
        levels[m["level"]] = {"link_class": m["link_class"], "span": int(m["span"]),
                              "kind": m.get("kind"), "nodes": sorted(set(m.get("nodes") or ())),
                              "ranks": ranks, **fit.as_dict()}
        all_rows += rows
    if not levels:
        raise ValueError("nothing was measured")
    links: dict[str, dict[str, Any]] = {}
    for name, lv in sorted(levels.items(), key=lambda kv: kv[1]["span"]):
        links.setdefault(lv["link_class"], {**lv, "level": name})
    doc: dict[str, Any] = {"version": 2, "mode": mode, "backend": backend,
                           "measured_at": datetime.now(UTC).isoformat(), "world_size": world,
                           "levels": levels, "links": links,
                           "rows": [r.as_dict() for r in all_rows]}
    upper = network_upper(levels)
    if upper:
        doc["network_upper"] = upper
    return doc


def network_upper(levels: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """Per-level bandwidth factor and added latency from the finest and coarsest network
    levels measured; None with fewer than two. The factor is capped at 1 (a coarser level is
    never modelled faster; on one loopback host it can measure so)."""
    net = sorted((lv for lv in levels.values() if lv["link_class"] == "network"),
                 key=lambda lv: lv["span"])
    if len(net) < 2 or net[-1]["span"] <= net[0]["span"]:
        return None
    lo, hi = net[0], net[-1]
    steps = hi["span"] - lo["span"]
    raw = (hi["gbs"] / lo["gbs"]) ** (1 / steps) if lo["gbs"] > 0 else 1.0
    return {"upper_level_factor": min(1.0, raw), "measured_factor": raw,
            "hop_alpha_us": max(0.0, (hi["alpha_us"] - lo["alpha_us"]) / steps),
            "spans": [lo["span"], hi["span"]]}
