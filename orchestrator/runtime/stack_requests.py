""""Stacks now" on the control plane's side (the leader's poller runs both functions): hand each
new request to its attempt's controller, which collects every rank's stacks through the
watchdog's diagnostics path and answers with a `Stacks` event; store that answer grouped
(orchestrator/watchdog/stacks.py). A request whose attempt ended, or that got no answer within
`DEADLINE_S`, fails with the reason."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.runtime.controller import find_controller, recorded_controller_name
from orchestrator.runtime.events import Stacks
from orchestrator.store.repo import Store
from orchestrator.watchdog.stacks import group_native, group_stacks

DEADLINE_S = 60.0


def serve_stack_requests(store: Store) -> None:
    now = datetime.now(UTC)
    for req in store.open_stack_requests():
        job = store.get_job(req.job_id)
        late = (now - req.requested_at).total_seconds() > DEADLINE_S
        if job is None or job.state.terminal or job.current_attempt != req.attempt:
            _failed(store, req.id, "the attempt ended before its stacks were collected")
        elif late:
            _failed(store, req.id, f"no answer within {DEADLINE_S:g} s")
        elif req.state == "pending" and \
                (handle := find_controller(req.job_id, req.attempt, recorded_controller_name(
                    store, req.job_id, req.attempt))) is not None:
            handle.collect_stacks.remote(req.id)
            store.update_stack_request(req.id, state="collecting")


def record_stacks(store: Store, answer: Stacks) -> None:
    groups = [g.to_dict() for g in group_stacks(answer.ranks)]
    result = {"groups": groups, "ranks_answered": len(answer.ranks),
              "errors": {str(r): e for r, e in answer.errors.items()}, "error": answer.error,
              "native": [g.to_dict() for g in group_native(answer.native)]}
    store.update_stack_request(answer.request_id, state="done" if answer.ranks else "failed",
                               result=result)


def _failed(store: Store, request_id: int, why: str) -> None:
    store.update_stack_request(request_id, state="failed", result={"error": why})
