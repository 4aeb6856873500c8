"""The agent's websocket to a hub, against a real trio-websocket server over real TLS on loopback."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio_websocket

from nodetask.link import LinkClosed
from roles.common.tls import ServingCertificate, generate_serving_certificate
from roles.edge.ws_link import open_ws_link
from tools.ports import free_port

HEADERS = [(b"authorization", b"Bearer the-token")]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[ServingCertificate, ServingCertificate]:
    """The hub's certificate, and another CA's (whose CA does not verify the hub)."""
    home = tmp_path_factory.mktemp("tls")
    hub = generate_serving_certificate(home / "hub", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    other = generate_serving_certificate(home / "other", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    return hub, other


@asynccontextmanager
async def echo_hub(certificate: ServingCertificate | None, seen: list[tuple[str, bytes]]) -> AsyncIterator[int]:
    """A websocket server that records each request's path and authorization and echoes messages; its port."""
    context = None
    if certificate is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certificate.cert_file, certificate.key_file)

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        seen.append((request.path, dict(request.headers).get(b"authorization", b"")))
        ws = await request.accept()
        try:
            while True:
                await ws.send_message(await ws.get_message())
        except trio_websocket.ConnectionClosed:
            pass

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, context)
        yield server.port
        nursery.cancel_scope.cancel()


def _client(certificate: ServingCertificate) -> ssl.SSLContext:
    """A client trusting ``certificate``'s CA alone."""
    return ssl.create_default_context(cadata=certificate.ca_bundle.decode())


async def test_a_link_carries_the_path_query_and_token_and_echoes_over_tls(
    certificates: tuple[ServingCertificate, ServingCertificate],
) -> None:
    """Over TLS the hub's CA verifies, the request names the node's path and query and carries the token."""
    hub, _ = certificates
    seen: list[tuple[str, bytes]] = []
    async with echo_hub(hub, seen) as port:
        url = f"wss://127.0.0.1:{port}/nodes/edge-1?v=2"
        async with open_ws_link(url, headers=HEADERS, ssl_context=_client(hub)) as link:
            await link.send(b"hello")
            assert await link.receive() == b"hello"
    assert seen == [("/nodes/edge-1?v=2", b"Bearer the-token")]


async def test_a_certificate_the_ca_does_not_verify_fails_at_once_saying_so(
    certificates: tuple[ServingCertificate, ServingCertificate],
) -> None:
    """Another CA's client fails with the verifier's reason (trio-websocket alone waits its 60 s connect
    timeout and says only ConnectionTimeout); the hub never sees a request."""
    hub, other = certificates
    seen: list[tuple[str, bytes]] = []
    async with echo_hub(hub, seen) as port:
        with trio.fail_after(30), pytest.raises(LinkClosed, match="certificate verify failed"):
            async with open_ws_link(f"wss://127.0.0.1:{port}/nodes/x", headers=HEADERS, ssl_context=_client(other)):
                pass
    assert seen == []


async def test_what_the_block_raises_reaches_the_caller_unwrapped_and_a_refused_port_is_a_closed_link() -> None:
    """An error of the caller's own comes out as it was raised, not in an exception group; nothing listening
    is a LinkClosed naming the connection."""
    seen: list[tuple[str, bytes]] = []
    async with echo_hub(None, seen) as port:
        with pytest.raises(KeyError, match="mine"):
            async with open_ws_link(f"ws://127.0.0.1:{port}/nodes/x", headers=HEADERS, ssl_context=None):
                raise KeyError("mine")
    closed = free_port()  # nothing listens there
    with pytest.raises(LinkClosed, match="connect"):
        async with open_ws_link(f"ws://127.0.0.1:{closed}/nodes/x", headers=HEADERS, ssl_context=None):
            pass


async def test_a_hub_that_refuses_the_handshake_is_a_closed_link_carrying_its_answer() -> None:
    """A 403 from the hub is a LinkClosed (not an exception group), with the hub's status and reason as its cause."""

    async def refuse(request: trio_websocket.WebSocketRequest) -> None:
        await request.reject(403, body=b"the token is not node x's")

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, refuse, "127.0.0.1", 0, None)
        with pytest.raises(LinkClosed) as raised:
            async with open_ws_link(f"ws://127.0.0.1:{server.port}/nodes/x", headers=HEADERS, ssl_context=None):
                pass
        nursery.cancel_scope.cancel()
    rejected = raised.value.__cause__
    assert isinstance(rejected, trio_websocket.ConnectionRejected)
    assert (rejected.status_code, rejected.body) == (403, b"the token is not node x's")


async def test_a_hub_whose_kernel_accepted_the_connection_but_never_answers_is_given_up_after_the_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A listening socket nothing accepts from (a hub killed after its kernel took the connection): the attempt
    ends as a LinkClosed once ``handshake_timeout`` is over, not at the 60 s default."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        began = trio.current_time()
        with pytest.raises(LinkClosed, match="no websocket within 7 s"):
            async with open_ws_link(
                f"ws://127.0.0.1:{port}/nodes/x", headers=HEADERS, ssl_context=None, handshake_timeout=7
            ):
                pass
        assert trio.current_time() - began == pytest.approx(7)
