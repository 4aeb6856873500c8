"""The endpoint a kubelet on the device uses as its API server: relayed online, answered from the cache offline.

Every request goes to the API server as the node (:mod:`.upstream`): get, list, watch, create,
update, patch, delete, status and lease writes alike, and its answer comes back as the API server
gave it (status, headers, body; a watch streamed as its events come). What the answers carry of the
node's objects is written to the cache (:mod:`.cache_feed`) by one writer task, in order, behind the
answer (a slow disk holds up the feed, not the kubelet, until :data:`FEED_QUEUE` answers wait; a key
that cannot be written goes to the error-key ledger, as for the hub's streams). When no tunnel can be
had (no hub session, a hub that does not relay, the API server unreachable), :mod:`.offline` answers,
except a write while a session relays: that one gets a 503 to send again (:meth:`NodeApi._unanswered`).
When a relaying session starts again, the watches answered offline end, so the kubelet lists anew
through the relay.

The kubelet speaks protobuf to an API server by default; the endpoint asks the API server for JSON
instead (clients read the answer by its content type), which is what the cache keeps. It forwards
neither credentials nor impersonation a local client sends: it speaks only as the node.

Security: it listens on 127.0.0.1 only and answers only requests addressed to a loopback name, like
YurtHub's; any local process can act as the node through it, so it is off unless ``nodeApi.enabled``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Final, NoReturn, final
from urllib.parse import parse_qs

import anyio
import anyio.abc
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from nodetask.messages import CacheDeleted
from roles.common.httpserver import Request, Response, Send, serve_http
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.local_api.answers import failure
from roles.edge.local_api.local_api import LOOPBACK, LOOPBACK_HOSTS, LocalApi
from roles.edge.local_api.requests import host_name
from roles.edge.node_api.cache_feed import CacheFeed, WatchLines, answer_feed, event_feed, object_target, wants_watch
from roles.edge.node_api.offline import RETRY_AFTER_S, OfflineAnswers
from roles.edge.node_api.tunnel_client import Offline, TunnelClient
from roles.edge.node_api.upstream import HEAD_TIMEOUT_S, NodeTlsSource, Upstream

__all__ = ["NodeApi", "serve_node_api"]

Log = structlog.typing.FilteringBoundLogger

MAX_ANSWER_BYTES: Final = 64 << 20
"""Largest answer (not a watch's) relayed; the API server's own lists of a node's objects are far smaller."""
MAX_REQUEST_BYTES: Final = 3 << 20
"""Largest request body taken: the API server's own limit on an object."""
FEED_QUEUE: Final = 256
MAX_CONNECTIONS: Final = 256
"""Connections at once (a kubelet holds a dozen watches); more are refused at accept with a 503."""
MAX_WATCHES: Final = 128
"""Watches at once, relayed or answered offline (each holds a connection, and a tunnel when relayed); one
more is answered 429 with Retry-After, which clients back off on."""
_NOT_FORWARDED: Final = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "authorization",
        "proxy-authorization",
    }
)
_NOT_RETURNED: Final = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-type", "trailer"}
)


def forwarded_headers(headers: tuple[tuple[str, str], ...], *, cached: bool) -> list[tuple[str, str]]:
    """A request's headers as the endpoint sends them on: no hop-by-hop ones, no credentials; JSON asked
    for the kinds the cache keeps (``cached``), whatever else as the client asked."""
    out = [(k, v) for k, v in headers if k not in _NOT_FORWARDED and not k.startswith("impersonate-")]
    if cached:
        accept = next((v for k, v in out if k == "accept"), "")
        out = [(k, v) for k, v in out if k != "accept"]
        out.append(("accept", accept if accept and "protobuf" not in accept else "application/json"))
    return out


@final
class NodeApi:
    """The request handler, and the cache feed's queue."""

    def __init__(
        self,
        *,
        node: str,
        upstream: Upstream,
        tunnels: TunnelClient,
        cache: DurableCache,
        local: LocalApi,
        feed: MemoryObjectSendStream[CacheFeed],
        log: Log,
        max_watches: int = MAX_WATCHES,
    ) -> None:
        self._node = node
        self._upstream = upstream
        self._tunnels = tunnels
        self._local = local
        self._offline = OfflineAnswers(cache, local, log=log)
        self._feed = feed
        self._log = log
        self.max_watches = max_watches
        self._relayed_watches = 0

    @property
    def watches(self) -> int:
        """Watches being served now, relayed or from the cache."""
        return self._relayed_watches + self._local.watches

    async def handle(self, request: Request) -> Response:
        """Answer one request (a ``roles.common.httpserver.Handler``)."""
        host = host_name(request.header("host") or LOOPBACK)
        if host not in LOOPBACK_HOSTS:
            return failure(
                HTTPStatus.FORBIDDEN,
                "Forbidden",
                f"the node's API endpoint answers only requests addressed to 127.0.0.1 or localhost, not {host}",
            )
        query = parse_qs(request.query, keep_blank_values=True)
        target, _ = object_target(request.path)
        watch = request.method == "GET" and wants_watch(target, query)
        if watch and self.watches >= self.max_watches:
            refused = failure(
                HTTPStatus.TOO_MANY_REQUESTS,
                "TooManyRequests",
                f"the node's API endpoint serves at most {self.max_watches} watches at once; try again later",
            )
            return dataclasses.replace(refused, headers=(("retry-after", "1"),))
        path = f"{request.path}?{request.query}" if request.query else request.path
        try:
            answer = await self._upstream.request(
                request.method,
                path,
                forwarded_headers(request.headers, cached=target is not None),
                request.body,
                head_timeout=None if watch else HEAD_TIMEOUT_S,
            )
        except Offline as exc:
            return await self._unanswered(request, str(exc))
        headers = tuple((k, v) for k, v in answer.headers if k not in _NOT_RETURNED)
        content_type = answer.header("content-type") or "application/json"
        if watch and answer.status == HTTPStatus.OK:
            kind = "" if target is None else target.resource.kind
            relay = functools.partial(self._relay_watch, answer.chunks(), answer.close, kind)
            return Response(status=answer.status, content_type=content_type, headers=headers, stream=relay)
        try:
            body = await answer.read(MAX_ANSWER_BYTES)
        except (anyio.BrokenResourceError, TimeoutError) as exc:
            await answer.close()
            return await self._unanswered(request, str(exc))
        await answer.close()
        for item in answer_feed(request.method, request.path, query, node=self._node, status=answer.status, body=body):
            await self._feed.send(item)
        return Response(status=answer.status, body=body, content_type=content_type, headers=headers)

    async def _unanswered(self, request: Request, why: str) -> Response:
        """What a request the API server did not answer gets: the offline answers while no hub session relays;
        while one does, a write gets a 503 to send again. It may or may not have been applied, and the offline
        answer (the cached object, as if written) would keep a kubelet from ever sending its status again."""
        if request.method in ("GET", "HEAD") or not self._tunnels.online:
            return await self._offline.answer(request, why)
        self._log.info("node_api_write_unanswered", method=request.method, path=request.path, why=why)
        refused = failure(
            HTTPStatus.SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            f"the API server did not answer this {request.method} ({why}): send it again",
        )
        return dataclasses.replace(refused, headers=(("retry-after", RETRY_AFTER_S),))

    async def _relay_watch(
        self, chunks: AsyncIterator[bytes], close: Callable[[], Awaitable[None]], kind: str, send: Send
    ) -> None:
        lines = WatchLines()
        self._relayed_watches += 1
        try:
            async for piece in chunks:
                await send(piece)
                if not kind:
                    continue  # a kind the cache does not keep: relayed only
                for line in lines.feed(piece):
                    if (item := event_feed(kind, line)) is not None:
                        await self._feed.send(item)
        except anyio.BrokenResourceError as exc:
            self._log.debug("node_api_watch_broke", kind=kind, error=str(exc))
        finally:
            self._relayed_watches -= 1
            with anyio.CancelScope(shield=True):
                await close()

    async def end_offline_watches(self) -> NoReturn:
        """End the watches answered offline each time a relaying session starts, so clients relist through it."""
        while True:
            await self._tunnels.changed.wait()
            if self._tunnels.online:
                self._local.end_watches()


async def _write_feed(cache: DurableCache, items: MemoryObjectReceiveStream[CacheFeed], log: Log) -> None:
    async with items:
        async for item in items:
            if isinstance(item, CacheDeleted):
                written = await cache.apply_deleted(item)
            else:
                written = await cache.apply(item)
            if not written:
                # The ledger holds the keys and why; the repair loop and the Autonomy condition take it from there.
                log.debug("node_api_feed_not_written", message=type(item).__name__)


async def serve_node_api(
    cache: DurableCache,
    tunnels: TunnelClient,
    tls: NodeTlsSource,
    *,
    node: str,
    port: int,
    log: Log,
    max_connections: int = MAX_CONNECTIONS,
    max_watches: int = MAX_WATCHES,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve the node's API endpoint on 127.0.0.1:``port`` until cancelled; reports the bound port.

    Errors: only binding errors (:class:`OSError`) escape.
    """
    log = log.bind(component="node_api")
    upstream = Upstream(tunnels, tls)
    feed, items = anyio.create_memory_object_stream[CacheFeed](FEED_QUEUE)
    local = LocalApi(cache, serve_secrets=True, log=log)
    api = NodeApi(
        node=node,
        upstream=upstream,
        tunnels=tunnels,
        cache=cache,
        local=local,
        feed=feed,
        log=log,
        max_watches=max_watches,
    )
    try:
        async with feed, anyio.create_task_group() as tg:
            tg.start_soon(_write_feed, cache, items, log)
            tg.start_soon(api.end_offline_watches)
            bound: int = await tg.start(
                functools.partial(
                    serve_http,
                    api.handle,
                    host=LOOPBACK,
                    port=port,
                    log=log,
                    max_connections=max_connections,
                    max_connections_per_peer=max_connections,
                    max_body_bytes=MAX_REQUEST_BYTES,
                )
            )
            log.info("node_api_listening", port=bound)
            task_status.started(bound)
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
    raise AssertionError("serve_http returned")  # pragma: no cover - it never does
