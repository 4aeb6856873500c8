"""The node API endpoint as a kubelet meets it without the API server: bounded watches, bad requests answered,
serving on, and no write made to look done while a hub session relays."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from nodetask.messages import CacheObjects
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.node_api.endpoint import serve_node_api
from roles.edge.node_api.tunnel_client import TunnelClient
from roles.edge.session import Session
from roles.edge.store.store import open_store

NODE = "edge-1"


@asynccontextmanager
async def endpoint(tmp_path: Path, *, max_watches: int = 2, relaying: bool = False) -> AsyncIterator[int]:
    """The endpoint over a durable cache holding the node and no credentials for the API server, with no hub
    session (or, ``relaying``, one that relays and nothing reading it); its port."""
    log = structlog.get_logger()
    tunnels = TunnelClient(log=log)
    async with open_store(tmp_path / "store.sqlite") as store:
        cache = await DurableCache.open(store, tmp_path, keep_secrets=True, log=log)
        node = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "resourceVersion": "5"}}
        await cache.apply(CacheObjects(kind="Node", objects=(msgspec.Raw(msgspec.json.encode(node)),)))
        serve = functools.partial(
            serve_node_api,
            cache,
            tunnels,
            lambda: None,
            node=NODE,
            port=0,
            log=log,
            max_watches=max_watches,
        )
        async with anyio.create_task_group() as tg:
            if relaying:
                queue, unread = anyio.create_memory_object_stream[Any](16)
                tg.start_soon(_hold, unread)
                await tg.start(tunnels.serve_session, Session(queue))
            yield await tg.start(serve)
            tg.cancel_scope.cancel()


async def _hold(stream: Any) -> None:
    """Keep the session's outbound stream open (a hub that reads nothing) until cancelled."""
    async with stream:
        await anyio.sleep_forever()


async def _exchange(port: int, request: bytes) -> tuple[anyio.abc.SocketStream, bytes]:
    """Send ``request`` raw; the connection and the first bytes answered (the head, at least)."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    await stream.send(request)
    head = b""
    with anyio.fail_after(10):
        while b"\r\n\r\n" not in head:
            head += await stream.receive()
    return stream, head


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".encode()


async def test_watches_past_the_bound_are_refused_with_429_and_retry_after(tmp_path: Path) -> None:
    """With its bound of watches open, one more watch is a 429 TooManyRequests naming the bound, with Retry-After."""
    async with endpoint(tmp_path, max_watches=2) as port:
        watch = _get(f"/api/v1/nodes?watch=true&fieldSelector=metadata.name%3D{NODE}")
        held = [await _exchange(port, watch) for _ in range(2)]
        assert all(head.startswith(b"HTTP/1.1 200") for _, head in held)
        stream, head = await _exchange(port, watch)
        assert head.startswith(b"HTTP/1.1 429")
        assert b"retry-after: 1" in head.lower()
        await stream.aclose()
        for held_stream, _ in held:
            await held_stream.aclose()
        # Once they are gone, watches are taken again.
        with anyio.fail_after(10):
            while True:
                stream, head = await _exchange(port, watch)
                await stream.aclose()
                if head.startswith(b"HTTP/1.1 200"):
                    break
                await anyio.sleep(0.05)


async def test_malformed_and_oversized_requests_get_http_errors_and_the_endpoint_serves_on(tmp_path: Path) -> None:
    """Garbage is a 400, a body past the API server's limit a 413, and the next request is answered from the cache."""
    async with endpoint(tmp_path) as port:
        stream, head = await _exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400")
        await stream.aclose()
        big = f"PUT /api/v1/nodes/{NODE} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {4 << 20}\r\n\r\n".encode()
        stream, head = await _exchange(port, big)
        assert head.startswith(b"HTTP/1.1 413")
        await stream.aclose()
        stream, head = await _exchange(port, _get(f"/api/v1/nodes/{NODE}"))
        assert head.startswith(b"HTTP/1.1 200")
        await stream.aclose()


async def test_a_request_not_addressed_to_loopback_is_refused(tmp_path: Path) -> None:
    """A request whose Host is not a loopback name (a web page's, through DNS rebinding) is a 403."""
    async with endpoint(tmp_path) as port:
        request = f"GET /api/v1/nodes/{NODE} HTTP/1.1\r\nhost: evil.example:10262\r\n\r\n".encode()
        stream, head = await _exchange(port, request)
        assert head.startswith(b"HTTP/1.1 403")
        await stream.aclose()


def _patch(path: str) -> bytes:
    body = b'{"status":{"conditions":[]}}'
    head = f"PATCH {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/merge-patch+json\r\n"
    return head.encode() + f"content-length: {len(body)}\r\n\r\n".encode() + body


async def test_a_write_the_api_server_did_not_answer_while_a_session_relays_gets_a_503_not_the_cached_object(
    tmp_path: Path,
) -> None:
    """A status PATCH that could not reach the API server though a hub relays is a 503 to send again;
    a read is still answered from the cache."""
    async with endpoint(tmp_path, relaying=True) as port:
        stream, head = await _exchange(port, _patch(f"/api/v1/nodes/{NODE}/status"))
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 503"), head
        assert b"retry-after: 1" in head.lower()
        stream, head = await _exchange(port, _get(f"/api/v1/nodes/{NODE}"))
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 200"), head


async def test_a_write_with_no_session_relaying_gets_the_cached_object_as_yurthub_answers(tmp_path: Path) -> None:
    """With no hub session at all the same PATCH gets the cached Node, 200, as OpenYurt's YurtHub answers it."""
    async with endpoint(tmp_path) as port:
        stream, head = await _exchange(port, _patch(f"/api/v1/nodes/{NODE}/status"))
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 200"), head
