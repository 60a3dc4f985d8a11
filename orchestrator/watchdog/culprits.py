"""Which hardware a diagnosis names with evidence, as (node, GPU): what the node health policy
cordons and what a restart avoids. Pure module.

Evidence is direct: NCCL / driver errors on the stuck ranks (a COMM_WEDGED suspect backed by
them), or device / NIC errors in the logs or exit of a hang's culprit ranks. Topology alone
("the only node every stuck group shares") is a suspicion, not evidence.

>>> from orchestrator.watchdog.report import RankLocation, RankReport
>>> r = DiagnosisReport(verdict=Verdict.NOT_JOINED, culprit_ranks=(1,), confidence=0.9,
...     summary="Rank 1 never entered all_reduce #4.", evidence=(RankReport(rank=1,
...     state="not_joined", nccl_errors=("CUDA error: an illegal memory access",),
...     location=RankLocation(node="n2", gpu=3)),))
>>> hardware_culprits(r)
(('n2', 3),)
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from orchestrator.watchdog.report import DiagnosisReport, Verdict

# Hardware verdicts whose suspect node a restart should avoid.
_HARDWARE_LEVELS = ("node",)

# Errors that name one GPU: CUDA / Xid / ECC / NVLink faults as the driver and CUDA print them.
GPU_ERROR = re.compile(
    r"\bcuda error|\bcudaerror|\bxid\b|\becc\b|\buncorrectable\b|\bnvlink\b|"
    r"device-side assert|illegal memory access|unspecified launch failure|gpu is lost|"
    r"fallen off the bus",
    re.IGNORECASE)
# Errors that name the node's network: InfiniBand / RoCE completion errors as NCCL prints them
# (a NIC serves several GPUs, so the node is the unit).
NIC_ERROR = re.compile(
    r"\bnet/ib\b|\bibv_|completion error|got completion|\bvendor err\b|\brdma\b|\broce\b|"
    r"\bnic error\b",
    re.IGNORECASE)
DEVICE_ERROR = re.compile(f"{GPU_ERROR.pattern}|{NIC_ERROR.pattern}", re.IGNORECASE)


def rank_nodes(report: DiagnosisReport) -> dict[int, str | None]:
    return {e.rank: e.location.node if e.location else None for e in report.evidence}


def _rank_gpus(report: DiagnosisReport) -> dict[int, int | None]:
    return {e.rank: e.location.gpu if e.location else None for e in report.evidence}


def hardware_culprits(report: DiagnosisReport) -> tuple[tuple[str, int | None], ...]:
    """(node, GPU or None) the report's hardware evidence names, when it names one node:
    a COMM_WEDGED suspect backed by NCCL errors, or culprit ranks of a hang whose own logs
    carry device / NIC errors; whatever the verdict, every GPU whose driver reports errors
    that take it out of service (uncorrectable ECC, fatal Xids). () when the evidence is not
    that specific."""
    driver = tuple(_gpu_of(hw.name) for hw in report.suspect_hardware
                   if hw.level.lower() == "gpu" and hw.driver_errors)
    if driver:
        return driver
    nodes, gpus = rank_nodes(report), _rank_gpus(report)
    if report.verdict is Verdict.COMM_WEDGED:
        named = suspect_nodes(report, nodes)
        if len(named) == 1:
            gpu_hw = [hw for hw in report.suspect_hardware if hw.level.lower() == "gpu"]
            one_gpu = {gpus.get(r) for hw in gpu_hw for r in hw.ranks}
            gpu = next(iter(one_gpu)) if len(one_gpu) == 1 else None
            return ((named[0], gpu),)
    if report.verdict in (Verdict.NOT_JOINED, Verdict.P2P_MISMATCH, Verdict.COMM_WEDGED,
                          Verdict.RANK_EXITED):
        bad = [e for e in report.evidence if e.rank in report.culprit_ranks
               and any(DEVICE_ERROR.search(x) for x in (*e.nccl_errors, e.exit_info or ""))]
        # A NIC error takes the node out; a GPU error only its GPU (when located).
        where = {(nodes.get(e.rank), None if any(NIC_ERROR.search(x) for x in (
            *e.nccl_errors, e.exit_info or "")) else gpus.get(e.rank)) for e in bad}
        named_nodes = {n for n, _ in where}
        if len(named_nodes) == 1 and None not in named_nodes:
            node = next(iter(named_nodes))
            one_gpu = {g for _, g in where}
            return ((str(node), next(iter(one_gpu)) if len(one_gpu) == 1 else None),)
    return ()


def _gpu_of(name: str) -> tuple[str, int | None]:
    """("n1", 3) of a GPU suspect's name "n1/GPU3"."""
    node, _, index = name.rpartition("/GPU")
    return (node, int(index)) if node and index.isdigit() else (name, None)


def suspect_nodes(report: DiagnosisReport, rank_nodes: Mapping[int, str | None]) -> tuple[
        str, ...]:
    """Nodes to avoid after a COMM_WEDGED verdict, only with hardware evidence: NCCL errors
    (IB completion, CUDA, system errors) on the stuck ranks. Topology alone ("the only node
    every stuck group shares") is a suspicion, not evidence: avoiding on it could strand a
    job whose only fault was in software. A suspect at node level names its node; GPU /
    NVLink-domain suspects name the node of their ranks; switch-level suspects span many
    nodes and are not avoided (placement cannot route around a switch by dropping a node)."""
    if not any(ev.nccl_errors for ev in report.evidence):
        return ()
    nodes: set[str] = set()
    for hw in report.suspect_hardware:
        level = hw.level.lower()
        if level in _HARDWARE_LEVELS:
            nodes.add(hw.name)
        elif level in ("gpu", "nvlink_domain", "nvlink", "device"):
            nodes.update(n for r in hw.ranks if (n := rank_nodes.get(r)))
    if not nodes and not report.suspect_hardware:  # errors without a located suspect
        nodes.update(n for r in report.culprit_ranks if (n := rank_nodes.get(r)))
    return tuple(sorted(nodes))
