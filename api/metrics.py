"""Prometheus metrics for one app: its own registry, so several apps (tests) never collide."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.lifecycle import JobState

# The *_created series double the exposition size and no dashboard here reads them.
disable_created_metrics()

# Buckets sized for a control-plane API: most answers take a few milliseconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class JobStateCollector(Collector):
    """Reads job counts from the store at scrape time, so the gauge is never stale."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("meshyard_jobs", "Jobs by lifecycle state.", labels=["state"])
        counts = self._counts()
        for state in JobState:
            family.add_metric([state.value], float(counts.get(state.value, 0)))
        yield family


class HttpMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "meshyard_http_requests", "HTTP requests answered.",
            ["method", "route", "status"], registry=self.registry,
        )
        self.latency = Histogram(
            "meshyard_http_request_duration_seconds", "HTTP request latency.",
            ["method", "route"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )

    def observe(self, *, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def add_job_counts(self, counts: Callable[[], dict[str, int]]) -> None:
        self.registry.register(JobStateCollector(counts))

    def render(self) -> bytes:
        return generate_latest(self.registry)
