"""The controller's Prometheus metrics, read from the live objects at scrape time.

Job and node-task counts come from the job cache of the reconciler currently leading, so a scrape
costs no API call and a follower (which has no cache) reports none, keeping sums across replicas
right. API write and conflict counters come from :class:`~roles.kube.Kube`'s own counters, the
leader gauge from the :class:`~roles.controller.leader.Elector`. Only reconcile latency is recorded
as it happens, through the reconciler's ``on_reconciled`` hook, and connections the webhook and
metrics ports refused at their caps, through the servers' ``on_refused`` hooks.

Nothing is registered globally: the role passes the registry it serves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final, Protocol, final

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as MetricCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from flows.nodejobs.overdue import overdue
from nodetask.phases import JobPhase, NodeTaskPhase
from schemas.kinds import KINDS, Kind

__all__ = ["ControllerMetrics", "JobCache", "LeaderState", "WriteCounts"]

PREFIX: Final = "nodetaskd_controller"
_KIND_OF_PLURAL: Final = {k.plural: k.kind for k in KINDS}
_JOB_PHASES: Final = tuple("New" if p is JobPhase.NONE else p.value for p in JobPhase)
# An unset node phase counts as Pending, as status.nodeCounts does.
_NODE_PHASES: Final = tuple(p.value for p in NodeTaskPhase if p is not NodeTaskPhase.NONE)


class WriteCounts(Protocol):
    """What :class:`~roles.kube.Kube` counts: status-write conflicts met and writes made."""

    @property
    def conflicts(self) -> int: ...

    @property
    def writes(self) -> int: ...


class LeaderState(Protocol):
    """Whether this instance leads (an :class:`~roles.controller.leader.Elector`)."""

    @property
    def is_leader(self) -> bool: ...


class JobCache(Protocol):
    """The reconciler's job cache, keyed by (plural, name)."""

    @property
    def jobs(self) -> Mapping[tuple[str, str], Any]: ...


def _job_phase(phase: JobPhase) -> str:
    return "New" if phase is JobPhase.NONE else phase.value


def _node_phase(phase: NodeTaskPhase) -> str:
    return NodeTaskPhase.PENDING.value if phase is NodeTaskPhase.NONE else phase.value


@final
class ControllerMetrics:
    """Registers the controller's metrics into ``registry``.

    Wire :meth:`observe_reconcile` as the reconciler's ``on_reconciled`` and run each leading term's
    reconciler inside :meth:`tracking`.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        kube: WriteCounts,
        leader: LeaderState,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._leader = leader
        self._now = now
        self._cache: JobCache | None = None
        self._latency = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Time one reconcile pass over a job took, API calls included.",
            ["kind"],
            registry=registry,
        )
        self.connections_refused = MetricCounter(
            f"{PREFIX}_connections_refused",
            "Connections closed as soon as accepted, by port (webhook, metrics) and the setting whose cap they met.",
            ["port", "limit"],
            registry=registry,
        )
        registry.register(self)

    def observe_reconcile(self, kind: Kind, seconds: float) -> None:
        """The reconciler's ``on_reconciled`` hook."""
        self._latency.labels(kind=kind.kind).observe(seconds)

    @contextmanager
    def tracking(self, cache: JobCache) -> Iterator[None]:
        """Report ``cache``'s jobs while the block runs (one leading term)."""
        self._cache = cache
        try:
            yield
        finally:
            self._cache = None

    def describe(self) -> Iterable[Metric]:
        """The families :meth:`collect` yields, so that the registry can refuse duplicates at registration."""
        return self._families()

    def collect(self) -> Iterable[Metric]:
        """Build every family from the current state; called by the registry on each scrape."""
        jobs, node_tasks, late, conflicts, writes, leader = self._families()
        # A snapshot: copying the values is one C-level step, so a scrape from another thread never
        # sees the dict change size mid-iteration.
        cached = tuple(self._cache.jobs.items()) if self._cache is not None else None
        if cached is not None:
            job_counts: Counter[tuple[str, str]] = Counter()
            node_counts: Counter[tuple[str, str]] = Counter()
            overdue_counts: Counter[str] = Counter()
            now = self._now()
            for (plural, _), job in cached:
                kind = _KIND_OF_PLURAL.get(plural, plural)
                job_counts[kind, _job_phase(job.status.phase)] += 1
                overdue_counts[kind] += overdue(job, now)
                for entry in job.status.node_status:
                    node_counts[kind, _node_phase(entry.phase)] += 1
            # Every kind and phase is reported, zeros included, so that series do not come and go.
            for kind in _KIND_OF_PLURAL.values():
                for phase in _JOB_PHASES:
                    jobs.add_metric([kind, phase], job_counts[kind, phase])
                for phase in _NODE_PHASES:
                    node_tasks.add_metric([kind, phase], node_counts[kind, phase])
                late.add_metric([kind], overdue_counts[kind])
        conflicts.add_metric([], self._kube.conflicts)
        writes.add_metric([], self._kube.writes)
        leader.add_metric([], 1 if self._leader.is_leader else 0)
        return [jobs, node_tasks, late, conflicts, writes, leader]

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
    ]:
        return (
            GaugeMetricFamily(
                f"{PREFIX}_jobs", "Node jobs in the leader's cache by kind and phase.", labels=["kind", "phase"]
            ),
            GaugeMetricFamily(
                f"{PREFIX}_node_tasks",
                "Node tasks of the cached jobs by kind and node phase.",
                labels=["kind", "phase"],
            ),
            GaugeMetricFamily(
                f"{PREFIX}_jobs_overdue",
                "Cached jobs still running past the latest end their nodes' timeouts and concurrency allow.",
                labels=["kind"],
            ),
            CounterMetricFamily(
                f"{PREFIX}_status_conflicts", "Status writes refused with 409 and retried on a fresh read.", labels=[]
            ),
            CounterMetricFamily(f"{PREFIX}_api_writes", "Successful writes to the API server.", labels=[]),
            GaugeMetricFamily(f"{PREFIX}_leader", "1 while this instance holds the leader lease, else 0.", labels=[]),
        )
