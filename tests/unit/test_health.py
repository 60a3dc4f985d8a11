"""The node health policy (orchestrator/nodes/health_policy.py), table by table."""

from __future__ import annotations

import pytest

from orchestrator.nodes.health_policy import (
    Cordon,
    Evidence,
    HealthPolicy,
    NodeState,
    Severity,
    admin_cordon,
    admin_uncordon,
    apply_evidence,
    cordoned_gpus,
    effective_state,
    evidence_from_diagnosis,
    evidence_from_failure,
    health_view,
)
from orchestrator.watchdog.report import (
    DiagnosisReport,
    RankLocation,
    RankReport,
    SuspectHardware,
    Verdict,
)

P = HealthPolicy(cordon_s=100.0, suspect_window_s=50.0, suspect_jobs_to_cordon=2)
NODES = {0: ("a", 0), 1: ("a", 1), 2: ("b", 0), 3: ("b", 1)}


def _report(verdict: Verdict, culprits: tuple[int, ...], *, errors: dict[int, str] | None = None,
            hw: tuple[SuspectHardware, ...] = (), exit_info: dict[int, str] | None = None
            ) -> DiagnosisReport:
    errors, exit_info = errors or {}, exit_info or {}
    ev = tuple(RankReport(rank=r, state="waiting",
                          nccl_errors=(errors[r],) if r in errors else (),
                          exit_info=exit_info.get(r),
                          location=RankLocation(node=n, gpu=g)) for r, (n, g) in NODES.items())
    return DiagnosisReport(verdict=verdict, culprit_ranks=culprits, confidence=0.9,
                           summary=f"{verdict.value} summary", evidence=ev, suspect_hardware=hw)


IB = "NCCL WARN NET/IB : Got completion from peer with error 12, vendor err 129"
CUDA = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize(("report", "expected"), [
    # COMM_WEDGED, NCCL errors, one node named -> cordon that node
    (_report(Verdict.COMM_WEDGED, (2, 3), errors={2: IB},
             hw=(SuspectHardware(level="node", name="b", ranks=(2, 3), reason="x"),)),
     [("b", None, Severity.CORDON)]),
    # COMM_WEDGED naming one GPU -> cordon that GPU
    (_report(Verdict.COMM_WEDGED, (2,), errors={2: CUDA},
             hw=(SuspectHardware(level="gpu", name="b/GPU0", ranks=(2,), reason="x"),)),
     [("b", 0, Severity.CORDON)]),
    # COMM_WEDGED on topology alone: a suspicion of software, nothing recorded
    (_report(Verdict.COMM_WEDGED, (2, 3),
             hw=(SuspectHardware(level="node", name="b", ranks=(2, 3), reason="x"),)), []),
    # a hang whose culprit logged a NIC error -> the whole node
    (_report(Verdict.NOT_JOINED, (3,), errors={3: IB}), [("b", None, Severity.CORDON)]),
    # a hang whose culprit logged a GPU error -> its GPU
    (_report(Verdict.NOT_JOINED, (3,), errors={3: CUDA}), [("b", 1, Severity.CORDON)]),
    # device errors on two nodes: not specific -> suspicion on the culprits' nodes
    (_report(Verdict.NOT_JOINED, (1, 3), errors={1: IB, 3: IB}),
     [("a", None, Severity.SUSPECT), ("b", None, Severity.SUSPECT)]),
    # a first timeout without hardware evidence -> suspect
    (_report(Verdict.NOT_JOINED, (1,)), [("a", None, Severity.SUSPECT)]),
    # a straggler is a warning about a job, never suspicion of its node on its own
    (_report(Verdict.STRAGGLER, (2,)), []),
    (_report(Verdict.STRAGGLER, (1, 3)), []),
    # software: nothing
    (_report(Verdict.COLLECTIVE_MISMATCH, (1,)), []),
    (_report(Verdict.NON_COLLECTIVE_HANG, (0, 1, 2, 3)), []),
    (_report(Verdict.RANK_EXITED, (1,), exit_info={1: "exit code 43"}), []),
    (_report(Verdict.RANK_EXITED, (1,), exit_info={1: f"died: {CUDA}"}),
     [("a", 1, Severity.CORDON)]),
])
def test_which_evidence_cordons(report: DiagnosisReport,
                                expected: list[tuple[str, int | None, Severity]]) -> None:
    evs = evidence_from_diagnosis(report, job_id="j", at=1.0, diagnosis_id=7)
    assert [(e.node, e.gpu, e.severity) for e in evs] == expected
    assert all(e.diagnosis_id == 7 and e.verdict == report.verdict.value for e in evs)


@pytest.mark.parametrize(("groups", "expected"), [
    ([{"signature": "RuntimeError: CUDA error: uncorrectable ECC error", "nodes": ["b"]}],
     ["b"]),
    ([{"signature": "WorkerDied: x", "example": "NET/IB : completion error", "nodes": ["a"]}],
     ["a"]),
    ([{"signature": "RuntimeError: CUDA error", "nodes": ["a", "b"]}], []),  # not one node
    ([{"signature": "ValueError: bad config", "nodes": ["a"]}], []),
    ([{"signature": "WorkerDied: rank died", "nodes": ["?"]}], []),
    # software deaths whose words contain a pattern's letters ("p-roce-ss", "ecc" ...)
    ([{"signature": "WorkerDied: worker process died: exit code 43", "nodes": ["a"]}], []),
    ([{"signature": "RuntimeError: Connection closed by peer [<ADDR>]", "example":
       "remote process exited or there was a network error", "nodes": ["a"]}], []),
    ([{"signature": "ValueError: necessary checks failed in nvlinker_config", "nodes": ["a"]}],
     []),
])
def test_a_rank_dying_with_a_device_error_cordons(groups: list[dict[str, object]],
                                                  expected: list[str]) -> None:
    evs = evidence_from_failure(groups, job_id="j", at=1.0)
    assert [e.node for e in evs] == expected
    assert all(e.severity == Severity.CORDON for e in evs)


@pytest.mark.parametrize(("groups", "expected"), [
    ([{"signature": "WorkerDied: worker process died: The actor <ID> is unavailable: The actor "
       "is temporarily unavailable: RpcError", "nodes": ["b"]}], ["b"]),
    ([{"signature": "WorkerDied: x", "example": "The actor died because its node has died.",
       "nodes": ["a"]}], ["a"]),
    ([{"signature": "WorkerDied: worker unreachable", "nodes": ["a", "b"]}], []),  # two nodes
    ([{"signature": "WorkerDied: worker process died: exit code 43", "nodes": ["a"]}], []),
    ([{"signature": "RuntimeError: peer unreachable", "nodes": ["a"]}], []),  # not a death
])
def test_a_rank_whose_host_is_lost_makes_it_suspect(groups: list[dict[str, object]],
                                                    expected: list[str]) -> None:
    evs = evidence_from_failure(groups, job_id="j", at=1.0)
    assert [e.node for e in evs] == expected
    assert all(e.severity == Severity.SUSPECT and e.reason.startswith("host unreachable")
               for e in evs)


def _sus(job: str, at: float, node: str = "a") -> Evidence:
    return Evidence(kind="diagnosis", node=node, severity=Severity.SUSPECT, reason=f"t {job}",
                    at=at, job_id=job)


@pytest.mark.parametrize(("events", "others", "now", "state"), [
    ([("j1", 0.0)], 1, 0.0, NodeState.SUSPECT),
    ([("j1", 0.0), ("j1", 1.0)], 1, 1.0, NodeState.SUSPECT),  # one job twice: still one job
    ([("j1", 0.0), ("j2", 10.0)], 1, 10.0, NodeState.CORDONED),  # two jobs within the window
    ([("j1", 0.0), ("j2", 60.0)], 1, 60.0, NodeState.SUSPECT),  # the first fell out
    ([("j1", 0.0), ("j2", 10.0)], 0, 10.0, NodeState.SUSPECT),  # the last schedulable node
])
def test_suspicion_adds_up_across_jobs(events: list[tuple[str, float]], others: int,
                                       now: float, state: NodeState) -> None:
    h = None
    for job, at in events:
        h = apply_evidence(h, [_sus(job, at)], policy=P, now=at, others_schedulable=others)
    assert h is not None and effective_state(h, now=now, policy=P) == state


def test_hard_evidence_cordons_even_the_last_node_and_expires() -> None:
    ev = Evidence(kind="preflight", node="a", severity=Severity.CORDON, reason="slow", at=0.0)
    h = apply_evidence(None, [ev], policy=P, now=0.0, others_schedulable=0)
    assert (h.state, h.since, h.until) == (NodeState.CORDONED, 0.0, 100.0)
    assert effective_state(h, now=99.0, policy=P) == NodeState.CORDONED
    assert effective_state(h, now=101.0, policy=P) == NodeState.SUSPECT  # probation
    assert effective_state(h, now=151.0, policy=P) == NodeState.HEALTHY
    again = apply_evidence(h, [ev], policy=P, now=120.0, others_schedulable=0)
    assert again.state == NodeState.CORDONED and again.until == 220.0


def test_gpu_cordon_keeps_the_node_schedulable() -> None:
    ev = Evidence(kind="diagnosis", node="b", gpu=1, severity=Severity.CORDON, reason="x",
                  at=0.0)
    h = apply_evidence(None, [ev], policy=P, now=0.0, others_schedulable=1)
    assert h.state == NodeState.SUSPECT and cordoned_gpus(h, now=50.0) == {1}
    assert cordoned_gpus(h, now=101.0) == set()
    view = health_view([h], now=50.0, policy=P)
    assert view.suspect == {"b"} and not view.cordoned and view.cordoned_gpus == {"b": {1}}


def test_admin_cordon_permanent_and_uncordon_clears_suspicion() -> None:
    h = admin_cordon(None, node="a", reason="bad DIMM", now=0.0, permanent=True, policy=P)
    assert effective_state(h, now=10 ** 9, policy=P) == NodeState.CORDONED
    assert h.until is None and "bad DIMM" in h.reason
    h = apply_evidence(h, [_sus("j1", 5.0)], policy=P, now=5.0, others_schedulable=1)
    assert effective_state(h, now=6.0, policy=P) == NodeState.CORDONED
    h = admin_uncordon(h, node="a", reason="replaced", now=6.0)
    assert effective_state(h, now=7.0, policy=P) == NodeState.HEALTHY
    # evidence from before the uncordon no longer adds up with new suspicion
    h = apply_evidence(h, [_sus("j2", 8.0)], policy=P, now=8.0, others_schedulable=1)
    assert h.state == NodeState.SUSPECT
    assert [e.kind for e in h.evidence][:1] == ["admin"]  # the history stays


def test_restart_avoids_the_node_of_a_hardware_culprit_on_the_first_diagnosis() -> None:
    from orchestrator.spec import Watchdog
    from orchestrator.watchdog.monitor import HangMonitor

    mon = HangMonitor.from_spec(Watchdog(action="restart"), world_size=4, now_s=0.0)
    hang = _report(Verdict.NOT_JOINED, (3,), errors={3: IB})
    assert mon.decide(hang).avoid_nodes == ("b",)
    plain = _report(Verdict.NOT_JOINED, (3,))
    assert mon.decide(plain).avoid_nodes == ()


def test_the_view_says_why_each_node_is_cordoned_and_until_when() -> None:
    timed = admin_cordon(None, node="a", reason="maintenance", now=0.0, permanent=False,
                         policy=P)
    forever = admin_cordon(None, node="b", reason="bad DIMM", now=0.0, permanent=True, policy=P)
    view = health_view([timed, forever], now=10.0, policy=P)
    assert view.cordoned == {"a", "b"}
    assert view.cordons == {"a": Cordon("a", "cordoned by admin: maintenance", 100.0),
                            "b": Cordon("b", "cordoned by admin: bad DIMM", None)}
    assert view.cordons["b"].to_dict()["permanent"] is True
    assert health_view([timed], now=101.0, policy=P).cordons == {}  # ended: suspect only
