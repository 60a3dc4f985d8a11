"""calibration.json in the data dir, and the LinkFigures it implies. Pure module.

The file (report.py has the full layout): {"version": 2, "levels": {...}, "links": {"pcie":
{"alpha_us": 35.2, "gbs": 1.9, "kind": "PHB", "span": 0, ...}}, "network_upper": {...},
"rows": [...]}. Link classes map onto the cost model's figures:
  nvlink   NVLink4 / NVLink3 / per-link figures (scaled 450 : 300 : 25) and nvlink_alpha_us
  pcie     the PCIe x16 figure of both generations and pcie_alpha_us; a ring measured over a
           PHB / NODE / SYS path is divided by that path's factor first (the cost model
           multiplies it back)
  network  the InfiniBand figure (NDR and HDR) and net_alpha_us, for one leaf switch (a
           finest measurement higher up is brought down by the per-level factor)
  network_upper  upper_level_factor and hop_alpha_us (two or more network levels measured)
  gloo     a calibration run with the gloo backend (CPU ranks) also sets the gloo figures the
           pre-flight check expects: its ``pcie`` class (the host path) -> loopback, its
           ``network`` class -> across hosts
so every estimate (`meshyard place`, the solver, the planner, the pre-flight check) uses
measured numbers once a calibration is stored.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.placement.links import LinkFigures

FILE_NAME = "calibration.json"
LINK_CLASSES = ("nvlink", "pcie", "network")


def path_in(data_dir: Path) -> Path:
    return Path(data_dir) / FILE_NAME


def save(data_dir: Path, doc: dict[str, Any]) -> Path:
    path = path_in(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    tmp.replace(path)  # readers never see half a file
    return path


def load(data_dir: Path) -> dict[str, Any] | None:
    path = path_in(data_dir)
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def figures_from(doc: dict[str, Any] | None, base: LinkFigures | None = None) -> LinkFigures:
    """LinkFigures with the measured classes overriding the defaults."""
    f = base or LinkFigures()
    links = (doc or {}).get("links", {})
    if "nvlink" in links:
        gbs, a = float(links["nvlink"]["gbs"]), float(links["nvlink"]["alpha_us"])
        f = replace(f, nvlink4_gbs=gbs, nvlink3_gbs=gbs * 300 / 450,
                    nvlink_per_link_gbs=gbs / 18, nvlink_alpha_us=a)
    if "pcie" in links:
        gbs, a = float(links["pcie"]["gbs"]), float(links["pcie"]["alpha_us"])
        gbs /= dict(f.pcie_factors).get(links["pcie"].get("kind") or "PIX", 1.0)
        f = replace(f, pcie4_x16_gbs=gbs, pcie5_x16_gbs=gbs, pcie_alpha_us=a)
    if "gloo" in str((doc or {}).get("backend") or "").split("+"):
        f = _gloo_figures(f, links)
    upper = (doc or {}).get("network_upper")
    if upper:
        f = replace(f, upper_level_factor=float(upper["upper_level_factor"]),
                    hop_alpha_us=float(upper["hop_alpha_us"]))
    if "network" in links:
        gbs, a = float(links["network"]["gbs"]), float(links["network"]["alpha_us"])
        above = max(0, int(links["network"].get("span", 1)) - 1)
        gbs /= f.upper_level_factor ** above
        a = max(0.0, a - f.hop_alpha_us * above)
        f = replace(f, ib_ndr_gbs=gbs, ib_hdr_gbs=gbs, net_alpha_us=a)
    return f


def _gloo_figures(f: LinkFigures, links: dict[str, Any]) -> LinkFigures:
    host = links.get("pcie")
    if host is not None and host.get("kind") is None:  # CPU ranks, not a GPU's PCIe path
        f = replace(f, gloo_loopback_gbs=float(host["gbs"]),
                    gloo_loopback_alpha_us=float(host["alpha_us"]))
    if "network" in links:
        f = replace(f, gloo_net_gbs=float(links["network"]["gbs"]),
                    gloo_net_alpha_us=float(links["network"]["alpha_us"]))
    return f


def load_figures(data_dir: Path) -> LinkFigures | None:
    """The calibrated figures, or None (the defaults) when nothing was measured."""
    doc = load(data_dir)
    return figures_from(doc) if doc and doc.get("links") else None
