"""A device's local Kubernetes API: the cloud objects its node needs, read from its cache, online or not.

Programs on the device (and ``kubectl --server=http://127.0.0.1:<port>``) get, list and watch the
node's Node, Pods, ConfigMaps and Secrets at the API server's paths, with its JSON, selectors and
errors, from the agent's cache (:class:`~roles.edge.cache.view.CacheView`), also while the cloud is
unreachable. It is a copy of the cloud, so it is read-only: every write is refused with a
Kubernetes ``Status`` 403 that says so. Its watches stream the cache's changes; when the cloud comes
back the agent ends them all (:meth:`LocalApi.end_watches`), so that clients list again and see
whatever changed while the device was offline.

Security: it listens on 127.0.0.1 only, answers only requests addressed to a loopback name (a web
page cannot reach it through DNS rebinding), and is off unless ``localApi.enabled``. Any local
process can read what it serves, so Secrets are refused unless ``localApi.serveSecrets`` allows them.
Any local process can also open connections: it takes at most ``localApi.maxConnections`` (100) in
all and ``localApi.maxConnectionsPerClient`` (25) from one client, a client being the user that owns
the connecting socket (:mod:`roles.edge.local_api.peers`: on loopback every client has the same
address), so one user's programs, opening connections or dripping their requests' heads, leave the
rest to the others. A connection refused at accept is told why by a 503 ``Status`` naming the
setting; one that sends no request head within 10 s is closed, as is one idle for 30 s
(:mod:`roles.common.httpserver`). A query parameter the API server reads as a number is read as it does, and
anything else, however long, is a 400 naming the parameter.

Import this module only when the local API is on: an agent with it off then loads none of it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final, NoReturn, final
from urllib.parse import parse_qs

import anyio
import anyio.abc
import structlog
import trio
from anyio.streams.memory import MemoryObjectReceiveStream

from nodetask.label_selectors import SelectorError
from roles.common.httpserver import DEFAULT_HEADER_TIMEOUT, Request, Response, Send, serve_http
from roles.common.slots import Refusal
from roles.edge.cache.kinds import Resource
from roles.edge.cache.view import CacheView, Change, ChangeType, resource_version
from roles.edge.local_api.answers import (
    JSON,
    details,
    encode,
    event_line,
    expired,
    failure,
    named,
    refusal_status,
    watch_event,
    with_kind,
)
from roles.edge.local_api.paths import (
    Target,
    api_group_list,
    api_resource_list,
    api_versions,
    parse_target,
    version_info,
)
from roles.edge.local_api.peers import client_name
from roles.edge.local_api.requests import BadRequest, Selection, host_name, selection, watch_start, watch_timeout

__all__ = ["LOOPBACK", "LOOPBACK_HOSTS", "LocalApi", "Serving", "serve_local_api"]

Log = structlog.typing.FilteringBoundLogger

LOOPBACK: Final = "127.0.0.1"
MAX_CONNECTIONS: Final = 100
"""Connections at once (each watch holds one); more are refused as soon as they are accepted."""
MAX_CONNECTIONS_PER_CLIENT: Final = 25
"""Connections at once from one client (the user owning its socket): a quarter, so that one user's
programs leave three quarters to the others'."""
_READS: Final = frozenset({"GET", "HEAD"})
_WRITES: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "[::1]"})


def _document(request: Request) -> bytes | None:
    """The discovery document at the request's path, if it names one."""
    match request.path.rstrip("/"):
        case "/api":
            return api_versions(request.header("host") or LOOPBACK)
        case "/api/v1":
            return api_resource_list()
        case "/apis":
            return api_group_list()
        case "/version":
            return version_info()
    return None


@dataclass(frozen=True, slots=True)
class _WatchPlan:
    """A watch as asked for, checked: what it streams, from where, for how long, and what ends it."""

    resource: Resource
    selection: Selection
    since: int | None
    """The resource version it starts after; None: the current objects first, as ADDED."""
    lifetime_s: float
    end: anyio.Event
    """:meth:`LocalApi.end_watches` sets it for the watches asked for before it was called."""


@final
class LocalApi:
    """The request handler of the local API over ``cache``, and the watches it is streaming."""

    def __init__(self, cache: CacheView, *, serve_secrets: bool, log: Log) -> None:
        self._cache = cache
        self._serve_secrets = serve_secrets
        self._log = log
        self._end = anyio.Event()
        """Set to end the watches running now; each watch holds the one current when it started."""
        self._watches = 0

    @property
    def watches(self) -> int:
        """Watches being streamed now."""
        return self._watches

    def end_watches(self) -> int:
        """End every watch being streamed (as when the cloud returns), so that their clients list again.

        Returns how many were streaming. Watches started afterwards are not affected.
        """
        ending, self._end = self._end, anyio.Event()
        ending.set()
        self._log.info("local_api_watches_ended", watches=self._watches)
        return self._watches

    async def handle(self, request: Request) -> Response:
        """Answer one request (a ``roles.common.httpserver.Handler``)."""
        target = parse_target(request.path)
        refusal = self._refusal(request, target)
        if refusal is not None:
            return refusal
        document = _document(request)
        if document is not None:
            return Response.json(HTTPStatus.OK, document)
        if target is None:
            return failure(HTTPStatus.NOT_FOUND, "NotFound", "the server could not find the requested resource")
        return await self._serve(target, parse_qs(request.query, keep_blank_values=True))

    async def _serve(self, target: Target, query: dict[str, list[str]]) -> Response:
        try:
            if target.watch or query.get("watch", [""])[0].lower() in ("true", "1"):
                return self._watch(target, query)
            if target.name:
                return await self._get(target)
            return await self._list(target, selection(target, query))
        except (SelectorError, BadRequest) as exc:
            return failure(HTTPStatus.BAD_REQUEST, "BadRequest", str(exc))

    def _refusal(self, request: Request, target: Target | None) -> Response | None:
        """The answer to a request the local API does not serve at all, or None."""
        host = host_name(request.header("host") or LOOPBACK)
        if host not in LOOPBACK_HOSTS:
            return failure(
                HTTPStatus.FORBIDDEN,
                "Forbidden",
                f"the local API answers only requests addressed to 127.0.0.1 or localhost, not {host}",
            )
        if request.method in _WRITES:
            return failure(
                HTTPStatus.FORBIDDEN,
                "Forbidden",
                f"{named(target) if target else request.path} is forbidden: this is the device's read-only copy"
                " of cloud objects (its local API); write through the cloud's API server",
                details(target) if target else None,
            )
        if request.method not in _READS:
            return failure(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowed", f"{request.method} is not supported")
        if target is not None and target.resource.kind == "Secret" and not self._serve_secrets:
            return failure(
                HTTPStatus.FORBIDDEN,
                "Forbidden",
                f"{named(target)} is forbidden: the local API serves Secrets only with localApi.serveSecrets"
                " (any local process can read what it serves)",
                details(target),
            )
        return None

    async def _get(self, target: Target) -> Response:
        obj = await self._cache.get(target.resource.kind, target.namespace, target.name)
        if obj is None:
            return failure(HTTPStatus.NOT_FOUND, "NotFound", f"{named(target)} not found", details(target))
        return Response.json(HTTPStatus.OK, encode(with_kind(obj, target.resource)))

    async def _list(self, target: Target, selection: Selection) -> Response:
        listing = await self._cache.list(target.resource.kind, target.namespace)
        return Response.json(
            HTTPStatus.OK,
            encode(
                {
                    "kind": f"{target.resource.kind}List",
                    "apiVersion": target.resource.api_version,
                    "metadata": {"resourceVersion": listing.resource_version},
                    "items": [obj for obj in listing.items if selection(obj)],
                }
            ),
        )

    def _watch(self, target: Target, query: dict[str, list[str]]) -> Response:
        # Everything that can be refused is checked here, before the 200 goes out.
        plan = _WatchPlan(
            resource=target.resource,
            selection=selection(target, query),
            since=watch_start(query),
            lifetime_s=watch_timeout(query),
            end=self._end,
        )
        return Response.streamed(HTTPStatus.OK, functools.partial(self._stream, plan), content_type=JSON)

    async def _stream(self, plan: _WatchPlan, send: Send) -> None:
        """Stream the watch for its lifetime, until its ``end`` is set, or until the cache ends it."""
        self._watches += 1
        try:
            with anyio.move_on_after(plan.lifetime_s), self._cache.subscribe(plan.resource.kind) as changes:
                async with anyio.create_task_group() as tg:

                    async def stop_at_end() -> None:
                        await plan.end.wait()
                        tg.cancel_scope.cancel()

                    tg.start_soon(stop_at_end)
                    await self._send_changes(plan, changes, send)
                    tg.cancel_scope.cancel()
        finally:
            self._watches -= 1

    async def _send_changes(self, plan: _WatchPlan, changes: MemoryObjectReceiveStream[Change], send: Send) -> None:
        # Subscribed first, listed second: the listing may already hold changes that are queued in the
        # subscription, and the resource versions tell which.
        selected, resource = plan.selection, plan.resource
        listing = await self._cache.list(resource.kind, selected.namespace)
        current = int(listing.resource_version)
        if plan.since is None:
            for obj in listing.items:
                if selected(obj):
                    await send(event_line(ChangeType.ADDED, with_kind(obj, resource)))
        elif plan.since != current:
            await send(expired(plan.since, current))
            return
        async for change in changes:
            if resource_version(change.object) <= current:
                continue
            if (event := watch_event(change, selected)) is not None:
                await send(event_line(event[0], with_kind(event[1], resource)))


def _client(stream: trio.SocketStream) -> str:
    """Who a connection's places count for: the user owning the client's socket."""
    try:
        local, remote = stream.socket.getsockname(), stream.socket.getpeername()
    except OSError:
        return "a client already gone"
    return client_name((local[0], local[1]), (remote[0], remote[1]))


@dataclass(frozen=True, slots=True)
class Serving:
    """A running local API: where it listens, and how the agent ends its watches."""

    port: int
    api: LocalApi


async def serve_local_api(
    cache: CacheView,
    *,
    port: int,
    log: Log,
    serve_secrets: bool = False,
    max_connections: int = MAX_CONNECTIONS,
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    task_status: anyio.abc.TaskStatus[Serving] = anyio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve the local API over ``cache`` on 127.0.0.1:``port`` until cancelled.

    Reports a :class:`Serving` through ``task_status`` once listening (``port=0`` picks a free port).
    At most ``max_connections`` connections at once, ``max_connections_per_client`` of them from one
    client; ``header_timeout`` is the HTTP server's (tests shorten it).

    Cancellation: cancelling the caller's scope closes the listener and every connection, watches included.
    Errors: only binding errors (:class:`OSError`, e.g. the port is taken) escape.
    """
    log = log.bind(component="local_api")
    api = LocalApi(cache, serve_secrets=serve_secrets, log=log)

    def refused(refusal: Refusal, client: str) -> Response:
        log.debug("local_api_connection_refused", client=client, limit=refusal)
        return refusal_status(refusal, client, total=max_connections, per_client=max_connections_per_client)

    serve = functools.partial(
        serve_http,
        api.handle,
        host=LOOPBACK,
        port=port,
        log=log,
        max_connections=max_connections,
        max_connections_per_peer=max_connections_per_client,
        peer_key=_client,
        refused=refused,
        header_timeout=header_timeout,
    )
    async with anyio.create_task_group() as tg:
        bound: int = await tg.start(serve)
        log.info(
            "local_api_listening",
            port=bound,
            serve_secrets=serve_secrets,
            max_connections=max_connections,
            max_connections_per_client=max_connections_per_client,
        )
        task_status.started(Serving(port=bound, api=api))
    raise AssertionError("serve_http returned")  # pragma: no cover - it never does
