"""How a failed attempt is reported: its reason and message (the cause first: the open
diagnosis, else the first rank to fail of its own error), what the cause points at
(`failures.blame`: the user's code, a node, or neither), whether `retry_on` names it, the
nodes the next attempt avoids, and the pre-flight check's own failure (its culprit links'
nodes). Secrets of the job never reach a message.
"""

from __future__ import annotations

from orchestrator.lifecycle import Reason
from orchestrator.preflight.verdict import culprits_of
from orchestrator.runtime.events import AttemptConfig, Failed
from orchestrator.runtime.failures import (
    EXIT_VERDICTS,
    Blame,
    RankFailure,
    attempt_failed,
    blame,
    cause_first,
    group_failures,
    user_error_message,
)
from orchestrator.runtime.failures import first_cause as cause_of
from orchestrator.runtime.gang import WorkerGang
from orchestrator.spec import SpecKind
from orchestrator.watchdog.report import DiagnosisReport


def failed_outcome(cfg: AttemptConfig, failures: list[RankFailure], *,
                   cause: DiagnosisReport | None, gang: WorkerGang | None = None) -> Failed:
    """A pre-flight failure (every rank raised PreflightFailed) names the culprit ranks'
    nodes and link class and is avoided by the next attempt.
    The attempt failed; its reason and message come from the open diagnosis when
    there is one (a hang, a rank's exit), else from the first rank to die or fail.
    User code that could not even load fails the same way on every attempt: it is a
    setup error and names no node as bad."""
    preflight = preflight_failure(failures, gang=gang, cfg=cfg)
    if preflight is not None:
        return preflight
    secrets = job_secrets(cfg)
    failed = attempt_failed(failures, cause, secrets=secrets)
    setup = bool(failures) and all(f.setup_error for f in failures)
    first = cause_of(cause_first(failures, cause.culprit_ranks if cause else ()))
    who = Blame.INFRA if first is None or (cause is not None and cause.verdict
                                           not in EXIT_VERDICTS) \
        else blame(first, user_code=cfg.spec.kind is SpecKind.USER_CODE)
    failed_nodes = () if setup or who is not Blame.NODE else tuple(
        sorted({n for grp in failed.groups[:1] for n in grp.nodes}))
    message, matched = failed.message, False
    if who is Blame.USER and first is not None and not setup:
        message = user_error_message(first, failed.message, secrets=secrets)
        matched = cfg.spec.fault_tolerance.retry_on.matches(
            error_type=first.error_type, exit_code=first.exit_code,
            text=f"{first.message}\n{first.traceback[-2000:]}")
    return Failed(reason=Reason.SETUP_ERROR if setup else failed.reason, message=message,
                  groups=failed.groups, failed_nodes=failed_nodes, blame=who,
                  retry_matched=matched)


def job_secrets(cfg: AttemptConfig) -> tuple[str, ...]:
    """The values a failure message must not show: the job's `entrypoint.env` values."""
    entry = cfg.spec.entrypoint
    return tuple(entry.env.values()) if entry is not None and entry.env else ()


def preflight_failure(failures: list[RankFailure], *, gang: WorkerGang | None,
                      cfg: AttemptConfig) -> Failed | None:
    """The attempt's end when its ranks failed the pre-flight check, else None."""
    checks = [f for f in failures if f.error_type == "PreflightFailed"]
    if not checks or len(checks) < len(failures):
        return None
    message = checks[0].message
    culprits = culprits_of(message)
    where = {r: (gang.ranks[r].node, gang.ranks[r].gpu) for r in gang.ranks} \
        if gang is not None else {}
    nodes = tuple(sorted({str(where[r][0]) for r in culprits if r in where and where[r][0]}))
    peers = {str(n) for n, _ in where.values() if n}
    detail = f" (culprit{'s' if len(culprits) != 1 else ''} " + ", ".join(
        f"rank {r} on {where[r][0]}" + (f" GPU {where[r][1]}" if where[r][1] is not None
                                          else "") for r in culprits if r in where) + \
        f"; the gang spans {len(peers)} node(s))" if culprits else ""
    return Failed(reason=Reason.PREFLIGHT_FAILED, message=f"{message}{detail}",
                  groups=tuple(group_failures(failures)), failed_nodes=nodes,
                  avoid_nodes=nodes)
