"""Node health: the ledger's states and the policy that moves a node between them. Pure module.

A node (and, where the evidence is that fine, one of its GPUs) is healthy, suspect or cordoned.
The scheduler never places on a cordoned node (a cordoned GPU counts as busy) and prefers
healthy nodes over suspect ones. What moves a node:

    evidence                                                        severity
    COMM_WEDGED whose hardware evidence (NCCL / device errors)      cordon (the GPU when the
      names one node or one GPU                                       suspect is a GPU)
    a hang whose culprit ranks carry device / NIC errors, all on    cordon
      one node
    a rank that died with a device or NIC error (CUDA, Xid, ECC,    cordon
      IB completion errors ...)
    a failed pre-flight check naming the node                       cordon
    a diagnosis round's driver errors on a GPU of the job            cordon that GPU
      (nvidia-smi -q: uncorrectable ECC, retired page / remapped
      row pending, remapping failure; kernel log: Xid 48, 63, 64,
      74, 79, 94, 95), whatever the verdict
    a first timeout (a hang naming culprit ranks without            suspect
      hardware evidence)
    a rank whose worker became unreachable, all on one node (Ray    suspect
      lost its host: crashed or cut off)
    a straggler (a warning: the job trains on, slower; a loaded     nothing
      host makes healthy ranks lag too), collective mismatch,
      non-collective hang, a plain crash

Suspicion adds up across jobs: `suspect_jobs_to_cordon` distinct jobs within
`suspect_window_s` cordon the node. Suspicion alone never cordons the last schedulable node
(the embedded single-node default must keep working). A cordon lasts `cordon_s` (then the node
is suspect for one more window) unless an admin made it permanent.

>>> p = HealthPolicy()
>>> ev = Evidence(kind="diagnosis", node="n1", severity=Severity.CORDON,
...               reason="COMM_WEDGED: NET/IB completion error", at=100.0, job_id="j1")
>>> h = apply_evidence(None, [ev], policy=p, now=100.0, others_schedulable=1)
>>> h.state.value, h.until
('cordoned', 3700.0)
>>> effective_state(h, now=3800.0, policy=p).value
'suspect'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from orchestrator.watchdog.culprits import DEVICE_ERROR, hardware_culprits, rank_nodes
from orchestrator.watchdog.report import DiagnosisReport, Verdict

MAX_EVIDENCE = 50  # per node, newest kept


class NodeState(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    CORDONED = "cordoned"


class Severity(StrEnum):
    SUSPECT = "suspect"
    CORDON = "cordon"


_SUSPICION_VERDICTS = (Verdict.NOT_JOINED, Verdict.P2P_MISMATCH, Verdict.COMM_WEDGED)


@dataclass(frozen=True)
class HealthPolicy:
    cordon_s: float = 3600.0  # how long a cordon lasts unless permanent
    suspect_window_s: float = 1800.0  # suspicion counts this long
    suspect_jobs_to_cordon: int = 3  # distinct jobs' suspicion within the window cordons


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence about a node (or one GPU of it)."""

    kind: str  # diagnosis | failure | preflight | admin
    node: str
    severity: Severity
    reason: str
    at: float  # epoch seconds
    job_id: str | None = None
    gpu: int | None = None
    diagnosis_id: int | None = None
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "severity": self.severity.value,
                "reason": self.reason[:500], "at": self.at, "job_id": self.job_id,
                "gpu": self.gpu, "diagnosis_id": self.diagnosis_id, "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evidence:
        gpu, diag = d.get("gpu"), d.get("diagnosis_id")
        return cls(kind=str(d.get("kind", "")), node=str(d.get("node", "")),
                   severity=Severity(d.get("severity", Severity.SUSPECT)),
                   reason=str(d.get("reason", "")), at=float(d.get("at") or 0.0),
                   job_id=d.get("job_id"), gpu=None if gpu is None else int(gpu),
                   diagnosis_id=None if diag is None else int(diag), verdict=d.get("verdict"))


@dataclass(frozen=True)
class NodeHealth:
    """A node's ledger entry. `gpus`: GPUs cordoned on their own (index -> until, None:
    permanent) while the node as a whole may stay schedulable."""

    node: str
    state: NodeState = NodeState.HEALTHY
    reason: str = ""
    since: float | None = None
    until: float | None = None  # a cordon's end; None with permanent or when not cordoned
    permanent: bool = False
    gpus: Mapping[int, float | None] = field(default_factory=dict)
    evidence: tuple[Evidence, ...] = ()
    cleared_at: float | None = None  # an admin's uncordon: evidence before it no longer counts

    def counts(self, e: Evidence, *, now: float, policy: HealthPolicy) -> bool:
        """Whether `e` still raises suspicion: recent, after the last uncordon, not admin."""
        after = self.cleared_at is None or e.at > self.cleared_at
        return e.kind != "admin" and after and now - e.at <= policy.suspect_window_s


def effective_state(h: NodeHealth | None, *, now: float, policy: HealthPolicy) -> NodeState:
    """The state now: an expired cordon leaves the node suspect for one suspicion window."""
    if h is None:
        return NodeState.HEALTHY
    if h.state == NodeState.CORDONED and (h.permanent or h.until is None or h.until > now):
        return NodeState.CORDONED
    recent = any(h.counts(e, now=now, policy=policy) for e in h.evidence)
    if h.state == NodeState.CORDONED:  # expired: on probation for one window
        ended = h.until if h.until is not None else 0.0
        return NodeState.SUSPECT if recent or now - ended <= policy.suspect_window_s \
            else NodeState.HEALTHY
    if h.state == NodeState.SUSPECT and recent:
        return NodeState.SUSPECT
    return NodeState.HEALTHY


def cordoned_gpus(h: NodeHealth | None, *, now: float) -> set[int]:
    if h is None:
        return set()
    return {g for g, until in h.gpus.items() if until is None or until > now}


def apply_evidence(h: NodeHealth | None, evidence: Sequence[Evidence], *, policy: HealthPolicy,
                   now: float, others_schedulable: int) -> NodeHealth:
    """The entry after `evidence` (all about one node). `others_schedulable`: how many other
    nodes can take work now (suspicion alone never cordons the last one)."""
    assert evidence, "apply_evidence needs evidence"
    node = evidence[0].node
    h = h or NodeHealth(node=node)
    state = effective_state(h, now=now, policy=policy)
    h = replace(h, state=state, evidence=(*h.evidence, *evidence)[-MAX_EVIDENCE:])
    gpus = dict(h.gpus)
    hard = [e for e in evidence if e.severity == Severity.CORDON]
    whole = [e for e in hard if e.gpu is None]
    for e in hard:
        if e.gpu is not None:
            gpus[e.gpu] = now + policy.cordon_s
    h = replace(h, gpus=gpus)
    if whole:
        return _cordon(h, whole[-1].reason, now=now, policy=policy)
    if hard:  # GPU-level only: the node stays schedulable, and suspect
        if state != NodeState.CORDONED:
            h = replace(h, state=NodeState.SUSPECT, reason=hard[-1].reason,
                        since=h.since if state == NodeState.SUSPECT else now, until=None)
        return h
    if state == NodeState.CORDONED:
        return h
    jobs = {e.job_id or f"#{i}" for i, e in enumerate(h.evidence)
            if e.severity == Severity.SUSPECT and h.counts(e, now=now, policy=policy)}
    last = evidence[-1].reason
    if len(jobs) >= policy.suspect_jobs_to_cordon and others_schedulable > 0:
        return _cordon(h, f"suspect in {len(jobs)} jobs within "
                       f"{policy.suspect_window_s:g} s; last: {last}", now=now, policy=policy)
    since = h.since if state == NodeState.SUSPECT else now
    return replace(h, state=NodeState.SUSPECT, reason=last, since=since, until=None)


def _cordon(h: NodeHealth, reason: str, *, now: float, policy: HealthPolicy) -> NodeHealth:
    if h.state == NodeState.CORDONED:
        until = None if h.permanent else max(h.until or 0.0, now + policy.cordon_s)
        return replace(h, reason=reason, until=until)
    return replace(h, state=NodeState.CORDONED, reason=reason, since=now,
                   until=None if h.permanent else now + policy.cordon_s)


def admin_cordon(h: NodeHealth | None, *, node: str, reason: str, now: float,
                 permanent: bool, policy: HealthPolicy, by: str = "admin") -> NodeHealth:
    ev = Evidence(kind="admin", node=node, severity=Severity.CORDON,
                  reason=f"cordoned by {by}: {reason}" if reason else f"cordoned by {by}",
                  at=now)
    h = h or NodeHealth(node=node)
    return replace(h, state=NodeState.CORDONED, reason=ev.reason, since=now, permanent=permanent,
                   until=None if permanent else now + policy.cordon_s,
                   evidence=(*h.evidence, ev)[-MAX_EVIDENCE:])


def admin_uncordon(h: NodeHealth | None, *, node: str, reason: str, now: float,
                   by: str = "admin") -> NodeHealth:
    """Healthy again: the evidence stays as history, but no longer counts as suspicion."""
    ev = Evidence(kind="admin", node=node, severity=Severity.SUSPECT,
                  reason=f"uncordoned by {by}: {reason}" if reason else f"uncordoned by {by}",
                  at=now)
    h = h or NodeHealth(node=node)
    return replace(h, state=NodeState.HEALTHY, reason=ev.reason, since=now, until=None,
                   permanent=False, gpus={}, cleared_at=now,
                   evidence=(*h.evidence, ev)[-MAX_EVIDENCE:])


# -- evidence from what the runtime observed -------------------------------------------------
def evidence_from_diagnosis(report: DiagnosisReport, *, job_id: str, at: float,
                            diagnosis_id: int | None = None) -> list[Evidence]:
    """What a stored diagnosis says about nodes (see the module doc's table).

    A GPU-level culprit cordons that GPU; the node goes suspect with it."""
    verdict = report.verdict.value
    common = {"kind": "diagnosis", "at": at, "job_id": job_id, "diagnosis_id": diagnosis_id,
              "verdict": verdict}
    hw = hardware_culprits(report)
    if hw:
        return [Evidence(node=node, gpu=gpu, severity=Severity.CORDON,
                         reason=f"{verdict}: {report.summary}", **common)  # type: ignore[arg-type]
                for node, gpu in hw]
    if report.verdict not in _SUSPICION_VERDICTS or report.verdict is Verdict.COMM_WEDGED:
        return []  # software (mismatch, non-collective) or wedged without hardware evidence
    nodes = rank_nodes(report)
    named = sorted({n for r in report.culprit_ranks if (n := nodes.get(r))})
    return [Evidence(node=n, severity=Severity.SUSPECT,
                     reason=f"first timeout ({verdict}): {report.summary}",
                     **common) for n in named]  # type: ignore[arg-type]


def evidence_from_failure(groups: Iterable[Mapping[str, Any]], *, job_id: str,
                          at: float) -> list[Evidence]:
    """A failed attempt's grouped errors (FailureGroup.to_dict()): ranks that died or raised
    with a device or NIC error cordon their node when the group names one node; ranks whose
    worker became unreachable (`HOST_LOST`: Ray lost the worker's host, not a process exit)
    make their one node suspect."""
    out = []
    for g in groups:
        text = f"{g.get('signature', '')}\n{g.get('example', '')}"
        nodes = [str(n) for n in g.get("nodes") or () if n and n != "?"]
        if len(nodes) != 1:
            continue
        what = str(g.get("message") or g.get("signature"))[:300]
        if DEVICE_ERROR.search(text):
            out.append(Evidence(kind="failure", node=nodes[0], severity=Severity.CORDON,
                                reason=f"device/NIC error: {what}", at=at, job_id=job_id))
        elif str(g.get("signature", "")).startswith("WorkerDied") and HOST_LOST.search(text):
            out.append(Evidence(kind="failure", node=nodes[0], severity=Severity.SUSPECT,
                                reason=f"host unreachable: {what}", at=at, job_id=job_id))
    return out


# What Ray says of an actor whose host is gone or cut off (the raylet and the process cannot be
# reached), as opposed to a worker process that exited on a live host.
HOST_LOST = re.compile(r"unreachable|actor is (temporarily )?unavailable|node (has )?died|"
                       r"node was terminated|missing too many heartbeats", re.IGNORECASE)


def preflight_evidence(*, node: str, reason: str, job_id: str, at: float,
                       cordon: bool = True) -> Evidence:
    return Evidence(kind="preflight", node=node, reason=f"pre-flight: {reason}", at=at,
                    job_id=job_id, severity=Severity.CORDON if cordon else Severity.SUSPECT)


def slow_link_evidence(*, node: str, reason: str, job_id: str, at: float) -> Evidence:
    """A running gang's steps slowed and this node's link measured as the slow end: suspect
    (the next placement's pre-flight check refuses it if it still is)."""
    return Evidence(kind="slow_link", node=node, reason=f"slow link: {reason}", at=at,
                    job_id=job_id, severity=Severity.SUSPECT)


def by_node(evidence: Iterable[Evidence]) -> dict[str, list[Evidence]]:
    out: dict[str, list[Evidence]] = {}
    for e in evidence:
        out.setdefault(e.node, []).append(e)
    return out


@dataclass(frozen=True)
class Cordon:
    """A cordoned node as a job waiting for it is told: why, and until when (None:
    permanent, until an admin uncordons it)."""

    node: str
    reason: str
    until: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason[:500], "until": self.until,
                "permanent": self.until is None}


@dataclass(frozen=True)
class HealthView:
    """What the scheduler needs from the ledger now."""

    cordoned: frozenset[str] = frozenset()  # node names
    suspect: frozenset[str] = frozenset()
    cordoned_gpus: Mapping[str, frozenset[int]] = field(default_factory=dict)
    cordons: Mapping[str, Cordon] = field(default_factory=dict)  # the cordoned nodes by name


def health_view(entries: Iterable[NodeHealth], *, now: float,
                policy: HealthPolicy) -> HealthView:
    suspect, gpus, cordons = set(), {}, {}
    for h in entries:
        state = effective_state(h, now=now, policy=policy)
        if state == NodeState.CORDONED:
            cordons[h.node] = Cordon(node=h.node, reason=h.reason,
                                     until=None if h.permanent else h.until)
        elif state == NodeState.SUSPECT:
            suspect.add(h.node)
        g = cordoned_gpus(h, now=now)
        if g:
            gpus[h.node] = frozenset(g)
    return HealthView(frozenset(cordons), frozenset(suspect), gpus, cordons)


@dataclass(frozen=True)
class NodeStatus:
    """One node as GET /v1/nodes shows it: the ledger entry read at `now`."""

    name: str
    node_id: str | None
    alive: bool
    state: NodeState
    reason: str
    since: float | None
    until: float | None
    permanent: bool
    cordoned_gpus: tuple[int, ...]
    evidence: tuple[Evidence, ...]

    @property
    def diagnosis_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(e.diagnosis_id for e in self.evidence
                                   if e.diagnosis_id is not None))


def node_statuses(*, nodes: Iterable[tuple[str, str | None, bool]],
                  entries: Iterable[NodeHealth], now: float,
                  policy: HealthPolicy) -> list[NodeStatus]:
    """Every registered node `(name, node_id, alive)` and every node with a ledger entry,
    by name."""
    known = {name: (nid, alive) for name, nid, alive in nodes}
    ledger = {h.node: h for h in entries}
    out = []
    for name in sorted(set(known) | set(ledger)):
        h = ledger.get(name)
        nid, alive = known.get(name, (None, False))
        state = effective_state(h, now=now, policy=policy)
        live = h is not None and state == h.state
        out.append(NodeStatus(
            name=name, node_id=nid, alive=alive, state=state,
            reason=h.reason if h is not None else "",
            since=h.since if live and h is not None else None,
            until=h.until if state == NodeState.CORDONED and h is not None else None,
            permanent=bool(h and h.permanent and state == NodeState.CORDONED),
            cordoned_gpus=tuple(sorted(cordoned_gpus(h, now=now))),
            evidence=h.evidence if h is not None else ()))
    return out
