"""Prometheus metrics for one app: its own registry, so several apps (tests) never collide.

Two kinds of series. Cluster-level ones (HTTP requests by route template, job counts by
state, node health, the warm pool) name no job, user or rank and are served to anonymous
scrapers (unless MESHYARD_METRICS_ANONYMOUS=off). Tenant series (each job's condition and
goodput, labelled with its id, name and culprit ranks) are built per scrape for the caller's
token, from the jobs that token may read: none for an anonymous scrape."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

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
from orchestrator.nodes.health_policy import NodeState, NodeStatus
from orchestrator.store.records import JobRecord, UserRecord

log = logging.getLogger(__name__)

# The *_created series double the exposition size and no dashboard here reads them.
disable_created_metrics()

# Buckets sized for a control-plane API: most answers take a few milliseconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class JobStateCollector(Collector):
    """Reads job counts from the store at scrape time, so the gauge is never stale."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Registering a collector without describe() would call collect(), i.e. query the
        # database while the app is being built.
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counts = self._counts()
        except Exception:  # a scrape must still return the HTTP metrics when the DB is down
            log.warning("job counts unavailable for /metrics", exc_info=True)
            return
        family = self._family()
        for state in JobState:
            family.add_metric([state.value], float(counts.get(state.value, 0)))
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily("meshyard_jobs", "Jobs by lifecycle state.", labels=["state"])


class JobConditionCollector(Collector):
    """Jobs with an open diagnosis, read from the store at scrape time: one series per such
    job (hung or straggling), valued by when the condition began (unix seconds)."""

    def __init__(self, jobs: Callable[[], list[JobRecord]]) -> None:
        self._jobs = jobs

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            jobs = self._jobs()
        except Exception:  # the HTTP metrics still answer when the DB is down
            log.warning("job conditions unavailable for /metrics", exc_info=True)
            return
        family = self._family()
        for job in jobs:
            c = job.condition
            if not c:
                continue
            family.add_metric([job.id, job.name, str(c.get("kind")), str(c.get("verdict")),
                               ",".join(str(r) for r in c.get("culprit_ranks") or ()),
                               str(c.get("headline", ""))], float(c.get("since_s") or 0))
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "meshyard_job_condition_since_seconds",
            "Jobs with an open diagnosis (hung or straggling), by when it began (unix s).",
            labels=["job_id", "job", "condition", "verdict", "culprit_ranks", "headline"])


class NodeHealthCollector(Collector):
    """The node health ledger at scrape time: one series per node and state (1 for the
    node's state, 0 for the others, so a query for cordoned nodes needs no absent()), and
    the GPUs cordoned on their own per node."""

    def __init__(self, statuses: Callable[[], list[NodeStatus]]) -> None:
        self._statuses = statuses

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            statuses = self._statuses()
        except Exception:  # the HTTP metrics still answer when the DB is down
            log.warning("node health unavailable for /metrics", exc_info=True)
            return
        state, gpus = self._families()
        for s in statuses:
            for st in NodeState:
                state.add_metric([s.name, st.value], 1.0 if s.state == st else 0.0)
            gpus.add_metric([s.name], float(len(s.cordoned_gpus)))
        yield state
        yield gpus

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily("meshyard_node_health", "Node health ledger: 1 for the "
                                  "node's state (healthy, suspect, cordoned).",
                                  labels=["node", "state"]),
                GaugeMetricFamily("meshyard_node_cordoned_gpus",
                                  "GPUs cordoned on their own, per node.", labels=["node"]))


class GoodputCollector(Collector):
    """Each active job's goodput ratio (productive / wall time so far), at scrape time."""

    def __init__(self, ratios: Callable[[], Iterable[tuple[JobRecord, float]]]) -> None:
        self._ratios = ratios

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            ratios = self._ratios()
        except Exception:  # the HTTP metrics still answer when the DB is down
            log.warning("goodput unavailable for /metrics", exc_info=True)
            return
        family = self._family()
        for job, ratio in ratios:
            family.add_metric([job.id, job.name], ratio)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily("meshyard_job_goodput_ratio",
                                 "Productive share of an active job's wall time so far.",
                                 labels=["job_id", "job"])


class WarmPoolCollector(Collector):
    """The runtime's warm pool at scrape time (Runtime.pool_status, cached a few seconds):
    its size per node and, per node, idle / leased actors and the memory the idle
    ones hold. Nothing when the runtime has no pool."""

    _NAMES = (("idle", "meshyard_warm_pool_idle_workers", "Warm workers waiting for a job."),
              ("leased", "meshyard_warm_pool_leased_workers", "Warm workers running a job."),
              ("idle_rss_bytes", "meshyard_warm_pool_idle_memory_bytes",
               "Resident memory of the idle warm workers (measured when warmed or handed back)."))

    def __init__(self, status: Callable[[], dict[str, Any] | None]) -> None:
        self._status = status

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families().values()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            status = self._status()
        except Exception:  # the HTTP metrics still answer when Ray does not
            log.warning("warm pool status unavailable for /metrics", exc_info=True)
            return
        if not status:
            return
        fams = self._families()
        fams["size"].add_metric([], float(status.get("size", 0)))
        for node, row in (status.get("nodes") or {}).items():
            for key, _, _ in self._NAMES:
                fams[key].add_metric([str(node)], float(row.get(key, 0)))
        yield from fams.values()

    @classmethod
    def _families(cls) -> dict[str, GaugeMetricFamily]:
        fams = {"size": GaugeMetricFamily("meshyard_warm_pool_size",
                                          "Warm workers the pool keeps per node.")}
        for key, name, doc in cls._NAMES:
            fams[key] = GaugeMetricFamily(name, doc, labels=["node_id"])
        return fams


def _visible(jobs: Iterable[JobRecord], viewer: UserRecord) -> list[JobRecord]:
    return [j for j in jobs if viewer.sees_all_jobs or j.owner == viewer.name]


class HttpMetrics:
    """`registry`: the cluster-level series. `render(viewer)` adds the tenant series of the
    jobs `viewer` may read."""

    def __init__(self, *, max_goodput_series: int = 200) -> None:
        self.max_goodput_series = max_goodput_series
        self._active_jobs: Callable[[], list[JobRecord]] = list
        self._goodput: Callable[[JobRecord], float] | None = None
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

    def add_job_conditions(self, jobs: Callable[[], list[JobRecord]]) -> None:
        """The active jobs, read at scrape time (each with an open condition is a series)."""
        self._active_jobs = jobs

    def add_node_health(self, statuses: Callable[[], list[NodeStatus]]) -> None:
        self.registry.register(NodeHealthCollector(statuses))

    def add_goodput(self, ratio: Callable[[JobRecord], float]) -> None:
        """A job's goodput ratio, computed at scrape time for the first visible active jobs."""
        self._goodput = ratio

    def add_warm_pool(self, status: Callable[[], dict[str, Any] | None]) -> None:
        self.registry.register(WarmPoolCollector(status))

    def render(self, viewer: UserRecord | None = None) -> bytes:
        """The cluster-level series, and with a `viewer` the series of the jobs they may
        read. Called off the event loop (the tenant series read the store)."""
        text = generate_latest(self.registry)
        if viewer is None:
            return text
        try:
            jobs = _visible(self._active_jobs(), viewer)
        except Exception:  # the cluster-level series still answer when the DB is down
            log.warning("jobs unavailable for /metrics", exc_info=True)
            return text
        tenant = CollectorRegistry(auto_describe=False)
        tenant.register(JobConditionCollector(lambda: jobs))
        if self._goodput is not None:
            ratio = self._goodput
            tenant.register(GoodputCollector(
                lambda: ((j, ratio(j)) for j in jobs[:self.max_goodput_series])))
        return text + generate_latest(tenant)
