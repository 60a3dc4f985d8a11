"""The node health ledger, applied: evidence the poller sees goes through the pure policy
(orchestrator/nodes/health_policy.py) into the store, and the scheduler reads the view it places by.

Each change of a node's state is also a job event (NODE_CORDONED / NODE_SUSPECT) on the job
whose evidence caused it, with the diagnosis id, so a reader of the job sees why its next
attempt went elsewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestrator.lifecycle import JobEventKind, Reason
from orchestrator.nodes.health_policy import (
    Evidence,
    HealthPolicy,
    HealthView,
    NodeHealth,
    NodeState,
    apply_evidence,
    by_node,
    effective_state,
    evidence_from_diagnosis,
    evidence_from_failure,
    health_view,
    preflight_evidence,
    slow_link_evidence,
)
from orchestrator.store.repo import Store
from orchestrator.watchdog.report import DiagnosisReport

log = logging.getLogger("meshyard.health")


def _schedulable_others(store: Store, node: str, *, now: float,
                        policy: HealthPolicy) -> int:
    """Alive registered nodes other than `node` that are not cordoned."""
    cordoned = {h.node for h in store.list_node_health()
                if effective_state(h, now=now, policy=policy) == NodeState.CORDONED}
    return sum(1 for n in store.list_nodes()
               if n.alive and n.name != node and n.name not in cordoned)


def record_evidence(store: Store, evidence: Sequence[Evidence], *, policy: HealthPolicy,
                    job_id: str | None = None, now: float | None = None) -> list[NodeHealth]:
    """Applies evidence to the ledger; returns the entries whose state changed."""
    now = time.time() if now is None else now
    node_ids = {n.name: n.node_id for n in store.list_nodes()}
    changed = []
    for node, evs in by_node(evidence).items():
        others = _schedulable_others(store, node, now=now, policy=policy)
        before: list[NodeState] = []

        def update(h: NodeHealth | None, evs: list[Evidence] = evs, others: int = others,
                   before: list[NodeState] = before) -> NodeHealth:
            before.append(effective_state(h, now=now, policy=policy))
            return apply_evidence(h, evs, policy=policy, now=now, others_schedulable=others)

        new = store.update_node_health(node, update, node_id=node_ids.get(node))
        if new.state != before[0]:
            changed.append(new)
            log.warning("node %s: %s -> %s (%s)", node, before[0].value, new.state.value,
                        new.reason)
            if job_id is not None:
                _job_event(store, job_id, new, evs)
    return changed


def _job_event(store: Store, job_id: str, h: NodeHealth, evs: Sequence[Evidence]) -> None:
    cordoned = h.state == NodeState.CORDONED
    diag = next((e.diagnosis_id for e in reversed(evs) if e.diagnosis_id is not None), None)
    until = "" if h.until is None else \
        f" until {time.strftime('%H:%M:%S', time.gmtime(h.until))} UTC"
    store.add_event(job_id, kind=JobEventKind.WARNING,
                    reason=(Reason.NODE_CORDONED if cordoned else Reason.NODE_SUSPECT).value,
                    message=f"node {h.node} {'cordoned' + until if cordoned else 'suspect'}: "
                    f"{h.reason}"[:2000],
                    data={"node": h.node, "state": h.state.value, "diagnosis_id": diag,
                          "until": h.until})


def record_diagnosis(store: Store, report: DiagnosisReport, *, job_id: str, diagnosis_id: int,
                     policy: HealthPolicy) -> list[NodeHealth]:
    now = time.time()
    evs = evidence_from_diagnosis(report, job_id=job_id, at=now, diagnosis_id=diagnosis_id)
    return record_evidence(store, evs, policy=policy, job_id=job_id, now=now) if evs else []


def record_failure(store: Store, groups: Iterable[Mapping[str, Any]], *, job_id: str,
                   policy: HealthPolicy) -> list[NodeHealth]:
    now = time.time()
    evs = evidence_from_failure(groups, job_id=job_id, at=now)
    return record_evidence(store, evs, policy=policy, job_id=job_id, now=now) if evs else []


def record_preflight(store: Store, nodes: Sequence[str], *, message: str, job_id: str,
                     policy: HealthPolicy) -> list[NodeHealth]:
    """A failed pre-flight check: its culprit's node is cordoned when it names one node,
    each named node is suspect when it names several."""
    now = time.time()
    evs = [preflight_evidence(node=n, reason=message, job_id=job_id, at=now,
                              cordon=len(nodes) == 1) for n in nodes]
    return record_evidence(store, evs, policy=policy, job_id=job_id, now=now) if evs else []


def record_slow_link(store: Store, node: str, *, message: str, job_id: str,
                     policy: HealthPolicy) -> list[NodeHealth]:
    """A running gang's slow link, measured to this node: it is suspect."""
    now = time.time()
    return record_evidence(store, [slow_link_evidence(node=node, reason=message, job_id=job_id,
                                                      at=now)], policy=policy, job_id=job_id,
                           now=now)


def current_view(store: Store, *, policy: HealthPolicy, now: float | None = None) -> HealthView:
    return health_view(store.list_node_health(), now=time.time() if now is None else now,
                       policy=policy)
