"""The agent's own health and metrics on loopback (``metrics: {enabled: true}``), for the device's monitoring.

``/healthz`` answers 200 while the agent's event loop serves. ``/metrics`` (Prometheus' text format) reads the
agent's state at each scrape (:meth:`~roles.edge.agent.EdgeAgent.observe`): node tasks by state, the outbox's
depth and the reports refused for good, the store's size and whether it can be read, whether a hub session is up
and how many were welcomed (a reconnect is one more), the cache's error keys and whether its ledger is
persisted, whether autonomy is requested and the Autonomy condition; beside every role's build info and process
metrics. Loaded only when on, as Prometheus' client is.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from http import HTTPStatus
from typing import Final, NoReturn

import anyio.abc
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from roles.common.httpserver import HttpRoute, Request, Response, router, serve_http
from roles.common.process_metrics import build_info
from roles.edge.observed import Observed
from roles.edge.store.records import TaskState

Log = structlog.typing.FilteringBoundLogger

LOOPBACK: Final = "127.0.0.1"
MAX_CONNECTIONS: Final = 8
"""A scraper or two, and someone's curl: more is no monitoring this endpoint is for."""
CONDITIONS: Final = ("True", "False", "Unknown")


class _Snapshot(Collector):
    """One scrape's metrics, from what the agent read for it."""

    def __init__(self, observed: Observed) -> None:
        self._observed = observed

    def collect(self) -> Iterator[Metric]:
        seen = self._observed
        tasks = GaugeMetricFamily(
            "nodetaskd_edge_tasks", "Node tasks on this device by state (finished ones until pruned).", labels=["state"]
        )
        for state in TaskState:
            tasks.add_metric([state.value], seen.tasks.get(state.value, 0))
        yield tasks
        yield _gauge("nodetaskd_edge_outbox_depth", "Reports not yet acknowledged by a hub.", seen.outbox_depth)
        yield _gauge("nodetaskd_edge_reports_dropped", "Reports the hubs refused for good.", seen.reports_dropped)
        yield _gauge("nodetaskd_edge_store_bytes", "Bytes the agent's store holds.", seen.store_bytes)
        yield _gauge("nodetaskd_edge_store_ok", "1 when the agent's store could be read.", not seen.store_problem)
        yield _gauge("nodetaskd_edge_hub_connected", "1 while a hub session is up.", seen.connected)
        yield CounterMetricFamily(
            "nodetaskd_edge_hub_sessions", "Hub sessions welcomed since the agent started.", value=seen.sessions
        )
        yield _gauge("nodetaskd_edge_cache_error_keys", "Cached objects the cache could not keep.", seen.error_keys)
        yield _gauge(
            "nodetaskd_edge_cache_ledger_persisted", "1 when the cache's ledger is on disk.", seen.ledger_persisted
        )
        yield _gauge("nodetaskd_edge_autonomy_requested", "1 when autonomy is requested.", seen.autonomy_requested)
        condition = GaugeMetricFamily(
            "nodetaskd_edge_autonomy_condition", "The Autonomy condition's status (1 on it).", labels=["status"]
        )
        for status in CONDITIONS:
            condition.add_metric([status], float(seen.autonomy_condition == status))
        yield condition


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))


def render(observed: Observed) -> bytes:
    """The agent's own metrics in Prometheus' text format (without the process's)."""
    registry = CollectorRegistry()
    registry.register(_Snapshot(observed))
    return generate_latest(registry)


def routes(observe: Callable[[], Awaitable[Observed]]) -> tuple[HttpRoute, ...]:
    """``/healthz`` and ``/metrics``, the latter from ``observe()`` at each scrape."""
    process = build_info()

    async def live(_: Request) -> Response:
        return Response.text(HTTPStatus.OK, "ok")

    async def metrics(_: Request) -> Response:
        body = generate_latest(process) + render(await observe())
        return Response(status=HTTPStatus.OK, body=body, content_type=CONTENT_TYPE_LATEST)

    return HttpRoute("GET", "/healthz", live), HttpRoute("GET", "/metrics", metrics)


async def serve_metrics(
    observe: Callable[[], Awaitable[Observed]], *, port: int, log: Log, task_status: anyio.abc.TaskStatus[int]
) -> NoReturn:
    """Serve :func:`routes` on 127.0.0.1:``port`` until cancelled; reports the bound port once listening.

    Errors: OSError when the port cannot be bound (``metrics.port`` is taken)."""
    serve = functools.partial(
        serve_http, router(routes(observe)), host=LOOPBACK, port=port, log=log, max_connections=MAX_CONNECTIONS
    )
    async with anyio.create_task_group() as tg:
        bound: int = await tg.start(serve)
        log.info("metrics_listening", port=bound)
        task_status.started(bound)
    raise AssertionError("serve_http returned")  # pragma: no cover - it never does


__all__ = ["render", "routes", "serve_metrics"]
