"""Health, readiness and metrics routes for the cloud roles, and the HTTP server they are served by.

The server itself is :mod:`roles.common.httpserver` (base install); its names are re-exported here so that
a cloud role imports its whole HTTP surface from one place. This module needs Prometheus' client
(the ``cloud`` extra), which is why the edge role may import :mod:`roles.common.httpserver` but not this.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from roles.common.httpserver import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    Handler,
    HttpRoute,
    Request,
    Response,
    Send,
    router,
    serve_http,
)
from roles.common.process_metrics import build_info

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "Handler",
    "HttpRoute",
    "Request",
    "Response",
    "Send",
    "build_info",
    "health_routes",
    "router",
    "serve_http",
]


def health_routes(
    *, ready: Callable[[], bool], registry: CollectorRegistry, why_not_ready: Callable[[], str] = lambda: ""
) -> tuple[HttpRoute, ...]:
    """``/healthz`` and ``/livez`` (200 while the event loop serves), ``/readyz`` (200 when ``ready()``,
    else 503 saying ``why_not_ready()``) and ``/metrics`` (Prometheus text format from ``registry``, and the
    ``nodetaskd_build_info`` gauge and ``process_*`` metrics every role's endpoint shows: see :func:`build_info`)."""
    build = build_info()

    async def live(_: Request) -> Response:
        return Response.text(HTTPStatus.OK, "ok")

    async def readyz(_: Request) -> Response:
        if ready():
            return Response.text(HTTPStatus.OK, "ok")
        return Response.text(HTTPStatus.SERVICE_UNAVAILABLE, why_not_ready() or "not ready")

    async def metrics(_: Request) -> Response:
        body = generate_latest(build) + generate_latest(registry)
        return Response(status=HTTPStatus.OK, body=body, content_type=CONTENT_TYPE_LATEST)

    return (
        HttpRoute("GET", "/healthz", live),
        HttpRoute("GET", "/livez", live),
        HttpRoute("GET", "/readyz", readyz),
        HttpRoute("GET", "/metrics", metrics),
    )
