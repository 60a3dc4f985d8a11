"""Server-side admission checks a spec must pass beyond its own validation.

The cluster's shape (largest node's GPU count) is cached for a couple of seconds: reading
every node's row (topology included) on each submission was ~10% of a submission's time, and
nodes change on the scale of minutes. A job admitted in that window against a stale shape
still waits in QUEUED with a pending reason; it is never placed wrongly.
"""

from __future__ import annotations

import threading
import time

from orchestrator.settings import Settings
from orchestrator.spec import FieldIssue, JobSpec, check_fits_cluster
from orchestrator.store.repo import Store


class ClusterShape:
    def __init__(self, store: Store, *, ttl_s: float = 2.0) -> None:
        self._store, self._ttl_s = store, ttl_s
        self._lock = threading.Lock()  # read from threadpool workers
        self._value, self._expires = 0, 0.0

    def max_gpus_per_node(self) -> int:
        with self._lock:
            if time.monotonic() < self._expires:
                return self._value
        value = max((n.gpus for n in self._store.list_nodes()), default=0)
        with self._lock:
            self._value, self._expires = value, time.monotonic() + self._ttl_s
        return value


def admission_issues(spec: JobSpec, *, settings: Settings, shape: ClusterShape
                     ) -> list[FieldIssue]:
    issues: list[FieldIssue] = []
    if spec.inject_fault is not None and not settings.allow_fault_injection:
        issues.append(FieldIssue("inject_fault", "fault injection is disabled on this server; "
                                 "remove inject_fault or start the server with "
                                 "--allow-fault-injection", "value_error"))
    max_gpus = shape.max_gpus_per_node()
    if max_gpus > 0:
        issues += check_fits_cluster(spec, max_gpus_per_node=max_gpus)
    return issues
