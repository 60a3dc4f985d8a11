"""The one line that says where a job is now. Pure module.

It is what the job page's header, the jobs list and `meshyard status` show: an open diagnosis
first ("hung since ..."), then why a queued job waits, the step a running job is at, and the
last transition's message otherwise (how a finished job ended).

>>> status_line(state=JobState.RUNNING, message="step 1 done", last_step=37, total_steps=200)
'training: step 37 of 200'
>>> status_line(state=JobState.RUNNING, message="", last_step=37, total_steps=0)
'training: step 37'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.lifecycle import JobState


def status_line(*, state: JobState, message: str, last_step: int | None, total_steps: int,
                pending_reason: Mapping[str, Any] | None = None,
                condition: Mapping[str, Any] | None = None) -> str:
    if condition and condition.get("text"):
        return str(condition["text"])
    if state == JobState.QUEUED and pending_reason:
        why = pending_reason.get("message") or pending_reason.get("kind") or "waiting"
        return f"waiting: {why}"
    if state == JobState.RUNNING:
        if not total_steps:  # a script that states no `steps`
            return (f"training: step {last_step}" if last_step is not None else
                    "running: the script reports no steps (its ranks' collectives show "
                    "its progress)")
        return f"training: step {last_step or 0} of {total_steps}"
    return message or state.value.lower()
