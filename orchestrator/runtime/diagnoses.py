"""Control-plane side of the hang watchdog: store the reports the controllers send.

The controller (orchestrator/runtime/hangwatch.py) emits `diagnosis` events holding a
`DiagnosisReport.to_dict()`; the poller writes each one here with the attempt it belongs to
and records a job event, so `GET /v1/jobs/{id}/diagnoses` and the dashboard show it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.store.repo import Store


def store_diagnosis(store: Store, job_id: str, attempt: int, ev: dict[str, Any]) -> None:
    report = dict(ev.get("report") or {})
    verdict = str(report.get("verdict") or "UNKNOWN")
    culprits = [int(r) for r in report.get("culprit_ranks") or ()]
    summary = str(report.get("summary") or "")
    report.setdefault("details", {})
    report["details"] = {**report["details"], "trigger": ev.get("trigger"),
                         "detected_at": ev.get("detected_at")}
    store.add_diagnosis(job_id, attempt, verdict=verdict, culprit_ranks=culprits,
                        summary=summary, report=report)
    kind = "info" if verdict == "STRAGGLER" else "warning"
    store.add_event(job_id, kind=kind, reason=verdict,
                    message=f"diagnosis (attempt {attempt}): {summary}",
                    data={"verdict": verdict, "culprit_ranks": culprits, "attempt": attempt})
