"""Driver-reported GPU errors (orchestrator/watchdog/gpu_errors.py) on `nvidia-smi -q` dumps
and kernel logs in the real formats (tests/fixtures/nvidia_smi/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.nodes.health_policy import (
    HealthPolicy,
    Severity,
    apply_evidence,
    evidence_from_diagnosis,
)
from orchestrator.watchdog.culprits import hardware_culprits
from orchestrator.watchdog.gpu_errors import bus_key, gpu_errors, parse_xids, to_dicts
from orchestrator.watchdog.hardware import with_driver_errors
from orchestrator.watchdog.report import DiagnosisReport, RankLocation, RankReport, Verdict

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_h100_dump_with_dram_uncorrectable_and_xids() -> None:
    got = gpu_errors(_read("smi_q_h100_2gpu_dram_uncorrectable_row_pending.txt"),
                     _read("dmesg_nvrm_xid_h100_node.txt"))
    assert [(g.index, g.bus_id, g.minor) for g in got] == [
        (0, "00000000:18:00.0", 0), (1, "00000000:2A:00.0", 1)]
    healthy, bad = got
    # GPU 0: correctable errors and application Xids (13, 43) only: reported, not fatal
    assert healthy.reasons == () and healthy.other_xids == (13, 43)
    assert (bad.volatile_uncorrectable, bad.aggregate_uncorrectable) == (2, 2)
    assert bad.remap_pending and not bad.remap_failed and not bad.retired_pending
    assert bad.reasons == (
        "2 uncorrectable ECC errors (volatile)", "remapped row pending (reset the GPU)",
        "Xid 94: contained uncorrectable ECC error",
        "Xid 63: ECC page retirement / row remapping recorded (reset the GPU)",
        "Xid 79: GPU has fallen off the bus")
    assert [d["index"] for d in to_dicts(got)] == [0, 1]


def test_v100_ecc_page_retirement_dump_with_legacy_xid_lines() -> None:
    got = gpu_errors(_read("smi_q_d_ecc_page_retirement_v100_4gpu.txt"),
                     _read("dmesg_nvrm_xid_legacy_v100.txt"))
    assert [g.bus_id for g in got] == ["00000000:06:00.0", "00000000:07:00.0",
                                       "00000000:0A:00.0", "00000000:0B:00.0"]
    reasons = {g.index: g.reasons for g in got}
    assert reasons[0] == ()  # 5 aggregate single-bit errors: corrected
    assert reasons[1] == ("3 uncorrectable ECC errors (aggregate)",
                          "retired page pending (reset the GPU)",
                          "Xid 48: double-bit ECC error",
                          "Xid 64: ECC page retirement / row remapping failure")
    assert got[1].other_xids == (45,)
    assert reasons[2] == ()
    assert reasons[3] == ("Xid 74: NVLink error",)
    assert to_dicts(got) == [
        {"index": 1, "bus_id": "00000000:07:00.0", "reasons": list(reasons[1]),
         "other_xids": [45]},
        {"index": 3, "bus_id": "00000000:0B:00.0", "reasons": list(reasons[3]),
         "other_xids": []}]


@pytest.mark.parametrize(("line", "bus", "code"), [
    ("[ 7311.4] NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has "
     "fallen off the bus.", "0000:2a:00", 79),
    ("kernel: NVRM: Xid (0000:07:00): 48, An uncorrectable double bit error", "0000:07:00", 48),
    ("NVRM: Xid (PCI:0000:b7:00.0): 95, pid=1, Uncontained: FBHUB. RST: Yes", "0000:b7:00", 95),
])
def test_xid_line_formats(line: str, bus: str, code: int) -> None:
    (x,) = parse_xids(line)
    assert (x.bus_id, x.code, x.fatal) == (bus, code, True)
    assert bus_key(x.bus_id) == bus_key(f"0000{bus}.0")


def test_no_kernel_log_and_no_gpus() -> None:
    assert gpu_errors("") == [] and parse_xids("NVRM: GPU at PCI:0000:2a:00: GPU-a1") == []
    (g, *_), = [gpu_errors(_read("smi_q_h100_2gpu_dram_uncorrectable_row_pending.txt"))]
    assert g.xids == ()


def _straggler_report() -> DiagnosisReport:
    locs = {0: RankLocation(node="n1", gpu=0), 1: RankLocation(node="n1", gpu=1),
            2: RankLocation(node="n2", gpu=0), 3: RankLocation(node="n2", gpu=1)}
    return DiagnosisReport(
        verdict=Verdict.NOT_JOINED, culprit_ranks=(3,), confidence=0.8,
        summary="Rank 3 never entered all_reduce #12.",
        evidence=tuple(RankReport(rank=r, state="waiting", location=loc)
                       for r, loc in locs.items()))


def test_driver_errors_name_the_gpu_and_the_policy_cordons_it() -> None:
    report = _straggler_report()
    locations = {e.rank: e.location for e in report.evidence if e.location}
    # Without driver errors a plain first timeout only makes the node suspect.
    plain = evidence_from_diagnosis(report, job_id="j1", at=10.0)
    assert [(e.node, e.gpu, e.severity) for e in plain] == [("n2", None, Severity.SUSPECT)]
    errs = gpu_errors(_read("smi_q_h100_2gpu_dram_uncorrectable_row_pending.txt"),
                      _read("dmesg_nvrm_xid_h100_node.txt"))
    got = with_driver_errors(report, {"n2": to_dicts(errs)}, locations)
    (hw, *_) = got.suspect_hardware
    assert (hw.level, hw.name, hw.ranks) == ("gpu", "n2/GPU1", (3,))
    assert "Xid 79: GPU has fallen off the bus" in hw.driver_errors
    assert "n2/GPU1 (2 uncorrectable ECC errors (volatile)" in got.summary
    assert got.recommendations[0].startswith("Take n2/GPU1 out of service")
    assert DiagnosisReport.from_dict(got.to_dict()) == got  # stored and read back
    assert hardware_culprits(got) == (("n2", 1),)
    (ev,) = evidence_from_diagnosis(got, job_id="j1", at=10.0)
    assert (ev.node, ev.gpu, ev.severity) == ("n2", 1, Severity.CORDON)
    h = apply_evidence(None, [ev], policy=HealthPolicy(), now=10.0, others_schedulable=1)
    assert h.gpus == {1: 10.0 + HealthPolicy().cordon_s}  # that GPU, not the whole node


def test_driver_errors_on_a_gpu_the_job_does_not_use_change_nothing() -> None:
    report = _straggler_report()
    locations = {e.rank: e.location for e in report.evidence if e.location}
    only_app = [{"index": 0, "bus_id": "x", "reasons": [], "other_xids": [13]}]
    elsewhere = [{"index": 5, "bus_id": "y", "reasons": ["Xid 48: double-bit ECC error"],
                  "other_xids": []}]
    assert with_driver_errors(report, {"n1": only_app, "n2": elsewhere}, locations) == report
