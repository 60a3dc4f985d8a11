"""calibration.json in the data dir, and the LinkFigures it implies. Pure module.

The file: {"version": 1, "backend": "gloo", "world_size": 2, "measured_at": ...,
"links": {"pcie": {"alpha_us": 35.2, "gbs": 1.9, ...}}, "rows": [...]}. Link classes map onto
the cost model's figures:
  nvlink   NVLink4 / NVLink3 / per-link figures (scaled 450 : 300 : 25) and nvlink_alpha_us
  pcie     the PCIe x16 figure of both generations and pcie_alpha_us
  network  the InfiniBand figure (NDR and HDR) and net_alpha_us
so every estimate (`meshyard place`, the solver, the planner) uses measured numbers once a
calibration is stored.
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
        f = replace(f, pcie4_x16_gbs=gbs, pcie5_x16_gbs=gbs, pcie_alpha_us=a)
    if "network" in links:
        gbs, a = float(links["network"]["gbs"]), float(links["network"]["alpha_us"])
        f = replace(f, ib_ndr_gbs=gbs, ib_hdr_gbs=gbs, net_alpha_us=a)
    return f


def load_figures(data_dir: Path) -> LinkFigures | None:
    """The calibrated figures, or None (the defaults) when nothing was measured."""
    doc = load(data_dir)
    return figures_from(doc) if doc and doc.get("links") else None
