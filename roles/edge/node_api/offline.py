"""The answers a kubelet gets while the cloud is unreachable: from the device's cache, as YurtHub gives them.

OpenYurt's YurtHub answers a node's requests from its local cache when the API server cannot be
reached (``pkg/yurthub/proxy/local``), by verb:

* **get, list**: the cached object or list; an object never cached is a 404 ``NotFound``.
* **watch**: a 200 whose stream sends nothing, held until its ``timeoutSeconds`` or until the
  cloud is back, so the client lists again then (and never spins).
* **create**: the request's own body back with 201 (events, a node's registration), so the
  kubelet takes it as done and goes on.
* **update, patch**: the cached object as it is, 200, the change not applied (a lease renewal, a
  node status): the kubelet carries on with the state it has.
* **delete, deletecollection**: 200 with a ``Status`` whose reason is ``Forbidden``: not done.

Here the same, with two changes that keep a kubelet honest rather than fooled: a watch streams the
cache's changes (the hub's streams stop offline, so in practice nothing) until it ends or the cloud
returns (:meth:`roles.edge.local_api.local_api.LocalApi.end_watches`); and a path the device never
caches gets a 503 ``ServiceUnavailable`` with ``Retry-After``, which a kubelet retries, instead of a
made-up answer.
"""

from __future__ import annotations

import dataclasses
from http import HTTPStatus
from typing import Final, final

import structlog

from roles.common.httpserver import Request, Response
from roles.edge.cache.view import CacheView
from roles.edge.local_api.answers import details, encode, failure, named, with_kind
from roles.edge.local_api.local_api import LocalApi
from roles.edge.local_api.paths import Target
from roles.edge.node_api.cache_feed import object_target

__all__ = ["RETRY_AFTER_S", "OfflineAnswers"]

Log = structlog.typing.FilteringBoundLogger

RETRY_AFTER_S: Final = "1"


@final
class OfflineAnswers:
    """Answers requests from ``cache`` (reads through ``local``, the local API's reader over the same cache)."""

    def __init__(self, cache: CacheView, local: LocalApi, *, log: Log) -> None:
        self._cache = cache
        self._local = local
        self._log = log

    async def answer(self, request: Request, why: str) -> Response:
        """The offline answer to ``request``; ``why`` says why the cloud was not asked (for the log)."""
        target, subresource = object_target(request.path)
        method = request.method
        self._log.debug("node_api_offline_answer", method=method, path=request.path, why=why)
        if target is None:
            unavailable = failure(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                f"the cloud is unreachable ({why}) and the device does not keep {request.path}",
            )
            return dataclasses.replace(unavailable, headers=(("retry-after", RETRY_AFTER_S),))
        if method in ("GET", "HEAD"):
            if subresource:
                request = dataclasses.replace(request, path=request.path.rstrip("/").rpartition("/")[0])
            return await self._local.handle(request)
        return await self._write(request, target)

    async def _write(self, request: Request, target: Target) -> Response:
        """What YurtHub answers a write with (see the module's docstring)."""
        method = request.method
        if method == "POST":
            content_type = request.header("content-type") or "application/json"
            return Response(status=HTTPStatus.CREATED, body=request.body, content_type=content_type)
        if method == "DELETE":
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "reason": "Forbidden",
                "message": "the cloud is unreachable: a delete waits for it (the device answers from its cache)",
                "details": details(target),
                "code": HTTPStatus.OK,
            }
            return Response.json(HTTPStatus.OK, encode(status))
        if method in ("PUT", "PATCH") and target.name:
            obj = await self._cache.get(target.resource.kind, target.namespace, target.name)
            if obj is None:
                return failure(HTTPStatus.NOT_FOUND, "NotFound", f"{named(target)} not found", details(target))
            return Response.json(HTTPStatus.OK, encode(with_kind(obj, target.resource)))
        return failure(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowed", f"{method} is not supported offline")
