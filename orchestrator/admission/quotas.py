"""Per-user quotas: the limits, how a user's effective limits are found, and the checks.

Pure. A limit of None means unlimited. An admin sets limits per user (`UserQuota` rows, each
field optional); a field left unset falls back to the server's default for non-admin users
and to unlimited for admins. Over a limit is a `QuotaExceeded` (HTTP 429) naming the quota and
its value.

>>> q = effective_quota(Quota(max_priority=5), defaults=Quota(max_queued_jobs=100,
...                     max_priority=0), is_admin=False)
>>> (q.max_queued_jobs, q.max_priority)
(100, 5)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.spec import JobSpec

QUOTA_NAMES = ("max_queued_jobs", "max_running_gpus", "max_running_cpus", "max_priority")


@dataclass(frozen=True)
class Quota:
    max_queued_jobs: int | None = None  # jobs waiting in QUEUED at once
    max_running_gpus: int | None = None  # GPUs held by the user's active jobs together
    max_running_cpus: float | None = None  # CPUs held by the user's active jobs together
    max_priority: int | None = None  # highest `priority` a job of the user may ask for


class QuotaExceeded(Exception):
    """The request goes over `quota` (whose value is `limit`). Maps to HTTP 429."""

    def __init__(self, quota: str, limit: float, message: str) -> None:
        super().__init__(message)
        self.quota, self.limit = quota, limit


def effective_quota(explicit: Quota | None, *, defaults: Quota, is_admin: bool) -> Quota:
    """Explicit per-user limits win; the rest is the default (non-admins) or unlimited."""
    base = Quota() if is_admin else defaults
    if explicit is None:
        return base
    return Quota(**{f.name: getattr(explicit, f.name) if getattr(explicit, f.name) is not None
                    else getattr(base, f.name) for f in fields(Quota)})


@dataclass(frozen=True)
class Usage:
    """GPUs and CPUs: what a job holds while it runs, or what a user's jobs hold together."""

    gpus: float = 0.0
    cpus: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpus + other.gpus, self.cpus + other.cpus)

    def share(self, total: Usage) -> float:
        """The dominant share of `total`: max(GPUs / total GPUs, CPUs / total CPUs)."""
        return max(self.gpus / total.gpus if total.gpus > 0 else 0.0,
                   self.cpus / total.cpus if total.cpus > 0 else 0.0)


def _over(quota: str, limit: float, what: str) -> QuotaExceeded:
    shown = f"{limit:g}" if isinstance(limit, float) else str(limit)
    return QuotaExceeded(quota, limit, f"quota {quota}={shown}: {what}; ask an admin to raise it "
                         f"(`meshyard quota set --user NAME --{quota.replace('_', '-')} N`)")


def _running_over(quota: Quota, *, held: Usage, size: Usage) -> QuotaExceeded | None:
    for name, limit, have, need, unit in (
            ("max_running_gpus", quota.max_running_gpus, held.gpus, size.gpus, "GPUs"),
            ("max_running_cpus", quota.max_running_cpus, held.cpus, size.cpus, "CPUs")):
        if limit is not None and have + need > limit:
            holds = f"the user's active jobs hold {have:g} {unit}; " if have else ""
            return _over(name, limit, f"{holds}the job needs {need:g} {unit}")
    return None


def check_submission(quota: Quota, *, priority: int, size: Usage) -> None:
    """Raises QuotaExceeded for a job that can never run within the user's limits."""
    if quota.max_priority is not None and priority > quota.max_priority:
        raise _over("max_priority", quota.max_priority,
                    f"priority {priority} is above the highest this user may ask for")
    over = _running_over(quota, held=Usage(), size=size)
    if over is not None:
        raise over


def running_block(quota: Quota, *, held: Usage, size: Usage) -> str | None:
    """Why a queued job must wait for the user's other jobs (the scheduler's check), or None
    when starting it keeps the user within max_running_gpus / max_running_cpus."""
    over = _running_over(quota, held=held, size=size)
    return str(over) if over is not None else None


def check_queued(quota: Quota, *, queued: int) -> None:
    """Raises QuotaExceeded when one more queued job would be over max_queued_jobs."""
    if quota.max_queued_jobs is not None and queued >= quota.max_queued_jobs:
        raise _over("max_queued_jobs", quota.max_queued_jobs,
                    f"{queued} jobs of this user are already queued; wait for them to start "
                    "or cancel some")


def job_size(spec: JobSpec, *, cluster_has_gpus: bool) -> Usage:
    """GPUs and CPUs the job holds once placed (`device: auto` runs on GPUs when the cluster
    has them)."""
    r = spec.resources
    on_gpus = r.device.value == "cuda" or (r.device.value == "auto" and cluster_has_gpus)
    return Usage(gpus=spec.world_size * r.gpus_per_worker if on_gpus else 0,
                   cpus=spec.world_size * r.cpus_per_worker)
