"""Server-side admission: the checks a spec must pass beyond its own validation, in order.

1. policy: the caller's role may change jobs, and the spec uses only code and data the
   deployment allows (403 / 422 naming the policy and its setting);
2. cluster fit, fault injection and the code package (uploaded by the submitter; admins may
   name any) (422 at a field);
3. quotas: priority, and the job's GPUs / CPUs against the user's running limits (429); the
   queued-jobs limit is counted by the store in the submitting transaction.

The cluster's shape (largest node's GPU count) is cached for a couple of seconds: reading
every node's row (topology included) on each submission was ~10% of a submission's time, and
nodes change on the scale of minutes. A job admitted in that window against a stale shape
still waits in QUEUED with a pending reason; it is never placed wrongly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from api.errors import PolicyRefused
from orchestrator.admission.access import may_submit, spec_violations
from orchestrator.admission.quotas import Quota, check_submission, effective_quota, job_size
from orchestrator.settings import Settings
from orchestrator.spec import FieldIssue, JobSpec, SpecValidationError, check_fits_cluster
from orchestrator.store.records import UserRecord
from orchestrator.store.repo import Store
from orchestrator.usercode.packages import package_exists


class ClusterShape:
    def __init__(self, store: Store, *, ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store, self._ttl_s, self._clock = store, ttl_s, clock
        self._lock = threading.Lock()  # read from threadpool workers
        self._value, self._expires = 0, 0.0

    def max_gpus_per_node(self) -> int:
        with self._lock:
            if self._clock() < self._expires:
                return self._value
        value = max((n.gpus for n in self._store.list_nodes()), default=0)
        with self._lock:
            self._value, self._expires = value, self._clock() + self._ttl_s
        return value


def check_policy(spec: JobSpec, *, user: UserRecord, settings: Settings,
                 code_refusal: str | None = None) -> None:
    """Raises PolicyRefused when the deployment does not let `user` run `spec`;
    `code_refusal`: why non-admins' code is refused now (a host that cannot confine it)."""
    denied = may_submit(user.role)
    violations = [denied] if denied else spec_violations(
        spec, role=user.role, policy=settings.policy(), code_refusal=code_refusal)
    if violations:
        raise PolicyRefused(violations)


def may_use_package(store: Store, user: UserRecord, digest: str, *,
                    packages_dir: Path) -> bool:
    """Stored, and uploaded by `user` (admins: any stored package). One answer for "not
    stored" and "someone else's", so neither tells a user the other."""
    return package_exists(packages_dir, digest) and (
        user.is_admin or store.owns_package(digest, user.name))


def admission_issues(spec: JobSpec, *, user: UserRecord, settings: Settings, store: Store,
                     shape: ClusterShape) -> list[FieldIssue]:
    issues: list[FieldIssue] = []
    if spec.inject_fault is not None and not settings.allow_fault_injection:
        issues.append(FieldIssue("inject_fault", "fault injection is disabled on this server; "
                                 "remove inject_fault or start the server with "
                                 "--allow-fault-injection", "value_error"))
    digest = spec.entrypoint.package if spec.entrypoint is not None else None
    if digest is not None and not may_use_package(store, user, digest,
                                                  packages_dir=settings.packages_dir):
        issues.append(FieldIssue("entrypoint.working_dir", f"package sha256:{digest} is not "
                                 "uploaded to this server by you; upload it first (POST "
                                 "/v1/packages, or `meshyard submit SPEC --working-dir DIR`)",
                                 "value_error"))
    max_gpus = shape.max_gpus_per_node()
    if max_gpus > 0:
        issues += check_fits_cluster(spec, max_gpus_per_node=max_gpus)
    return issues


def user_quota(store: Store, user: UserRecord, settings: Settings) -> Quota:
    return effective_quota(store.get_quota(user.name), defaults=settings.quota_defaults(),
                           is_admin=user.is_admin)


def admit(spec: JobSpec, *, user: UserRecord, settings: Settings, store: Store,
          shape: ClusterShape) -> Quota:
    """Checks 2 and 3 on the spec as it will be stored; returns the user's quota (the store
    enforces its max_queued_jobs)."""
    issues = admission_issues(spec, user=user, settings=settings, store=store,
                              shape=shape)
    if issues:
        raise SpecValidationError(issues)
    quota = user_quota(store, user, settings)
    check_submission(quota, priority=spec.priority,
                     size=job_size(spec, cluster_has_gpus=shape.max_gpus_per_node() > 0))
    return quota
