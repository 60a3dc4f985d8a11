"""Submitting a job beyond its admission checks: `parallelism: auto` resolved to the top plan
on the cluster now (and recorded as the job's PLANNED event), the checkpoint a job resumes
from (`checkpoint.resume_from`: the submitter's own job's, or any for an admin, still kept),
and whether a retried submission is the same payload.
"""

from __future__ import annotations

from typing import Any

from api.errors import Unprocessable
from api.store_views import cluster_from_store
from orchestrator.lifecycle import JobEventKind, Reason
from orchestrator.planner.autoplan import format_table, resolve_auto
from orchestrator.planner.calibration.figures import load_figures
from orchestrator.planner.planner import PlanningError
from orchestrator.settings import Settings
from orchestrator.spec import FieldIssue, JobSpec
from orchestrator.store.records import JobRecord, UserRecord
from orchestrator.store.repo import Store


def resolve_submitted(spec: JobSpec, *, store: Store, settings: Settings
                      ) -> tuple[JobSpec, dict[str, Any] | None]:
    """For the submit route: a `parallelism: auto` spec becomes the top plan's spec; returns
    the plan (top plans, table) to record with the job, or None for other specs."""
    if not spec.parallelism.auto:
        return spec, None
    try:
        resolved, result = resolve_auto(spec, cluster=cluster_from_store(store, settings),
                                        figures=load_figures(settings.data_dir))
    except PlanningError as exc:
        raise Unprocessable([FieldIssue("parallelism.auto", str(exc), "value_error")]) from None
    assert result is not None
    return resolved, {"plan": result.plans[0].as_dict(), "result": result.as_dict(),
                      "table": format_table(result), "submitted": spec.model_dump(mode="json")}


def check_resume_from(spec: JobSpec, *, user: UserRecord, store: Store) -> None:
    """`checkpoint.resume_from` names a kept checkpoint of a job the submitter owns (an admin:
    any job); else 422 naming the field. Another user's job reads as unknown."""
    resume = spec.checkpoint.resume_from
    if resume is None:
        return
    src = store.get_job(resume.job)
    if src is None or not (user.is_admin or src.owner == user.name):
        raise Unprocessable([FieldIssue("checkpoint.resume_from.job", f"no job {resume.job} of "
                                        "yours; GET /v1/jobs lists them", "not_found")])
    kept = sorted({c.step for c in store.list_checkpoints(src.id) if not c.removed})
    if resume.step not in kept:
        have = (f"its kept checkpoints are of steps {', '.join(map(str, kept[-10:]))}"
                if kept else "it has no kept checkpoint")
        raise Unprocessable([FieldIssue("checkpoint.resume_from.step", f"job {src.id} has no "
                                        f"kept checkpoint of step {resume.step}; {have}",
                                        "not_found")])


def same_submission(store: Store, job: JobRecord, *, submitted: JobSpec,
                    resolved: JobSpec) -> bool:
    """Is a retried submission the same payload? An auto spec is compared as submitted (its
    plan may differ now that the cluster has changed), others as stored."""
    if not submitted.parallelism.auto:
        return bool(job.spec_doc == resolved.model_dump(mode="json"))
    planned = next((e.data for e in store.list_events(job.id) if e.reason == Reason.PLANNED), None)
    return planned is not None and planned.get("submitted") == submitted.model_dump(mode="json")


def record_plan(store: Store, job_id: str, planned: dict[str, Any]) -> None:
    store.add_event(job_id, kind=JobEventKind.INFO, reason=Reason.PLANNED.value,
                    message=f"parallelism: auto -> {planned['plan']['label']} "
                            f"(est. {planned['plan']['step_s']:.3g} s/step)", data=planned)

