"""The store: one object the control plane and the API use for every read and write.

>>> from orchestrator.store import open_store
>>> store = open_store("sqlite:///.meshyard/meshyard.db")   # migrates, then connects
"""

from __future__ import annotations

from orchestrator.store.jobs import JobOps
from orchestrator.store.metric_values import MetricValueOps
from orchestrator.store.node_health import HealthOps
from orchestrator.store.packages import PackageOps
from orchestrator.store.quotas import QuotaOps
from orchestrator.store.sessions import SessionOps
from orchestrator.store.stack_requests import StackRequestOps
from orchestrator.store.telemetry import TelemetryOps
from orchestrator.store.utilisation import UsageOps


class Store(SessionOps, QuotaOps, JobOps, TelemetryOps, MetricValueOps, UsageOps,
            StackRequestOps, HealthOps, PackageOps):
    """Each method is one transaction. Returns frozen records, never rows."""

    def close(self) -> None:
        self.engine.dispose()
