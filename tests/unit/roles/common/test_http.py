"""The HTTP server on loopback sockets (routing, limits, keep-alive, failures, TLS, health) and its certificates."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import h11
import prometheus_client
import pytest
import structlog
import trio
from cryptography import x509
from structlog.testing import capture_logs

from roles.common.health import Handler, HttpRoute, Request, Response, Send, health_routes, router, serve_http
from roles.common.tls import (
    ServingCertificate,
    TlsError,
    generate_serving_certificate,
    load_serving_certificate,
    server_ssl_context,
)
from roles.common.version import package_version

LOOPBACK = "127.0.0.1"


async def _echo(request: Request) -> Response:
    return Response.text(200, f"{request.method} {request.path}?{request.query} {len(request.body)}")


async def _boom(request: Request) -> Response:
    raise RuntimeError("handler bug")


ROUTES = (
    HttpRoute("POST", "/echo", _echo),
    HttpRoute("GET", "/echo", _echo),
    HttpRoute("GET", "/files/", _echo, prefix=True),
    HttpRoute("GET", "/boom", _boom),
)


@asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[int]:
    """The server on a free loopback port for the duration of the block."""
    kwargs.setdefault("log", structlog.get_logger())
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            partial(serve_http, kwargs.pop("handler", router(ROUTES)), host=LOOPBACK, port=0, **kwargs)
        )
        yield port
        nursery.cancel_scope.cancel()


class Client:
    """A raw HTTP/1.1 client over one connection, parsing responses with h11."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()
    ) -> tuple[int, dict[str, str], bytes]:
        hdrs = [("host", "test"), ("content-length", str(len(body))), *headers]
        data = self.conn.send(h11.Request(method=method, target=path, headers=hdrs)) or b""
        data += self.conn.send(h11.Data(data=body)) or b""
        data += self.conn.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)
        return await self.response()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = 0, {}, b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(bytes(await self.stream.receive_some(65536)))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                return status, headers, body
            else:
                raise AssertionError(f"unexpected {event!r}")


async def _raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    stream = await trio.open_tcp_stream(LOOPBACK, port)
    async with stream:
        await stream.send_all(data)
        received = b""
        while chunk := await stream.receive_some(65536):
            received += chunk
        return received


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    """One connection carries several requests, with path, query and body passed to the handler."""
    with trio.fail_after(10):
        async with serving() as port:
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                for i in range(3):
                    status, headers, body = await client.request("POST", f"/echo?i={i}", b"x" * i)
                    assert (status, body) == (200, f"POST /echo?i={i} {i}\n".encode())
                    assert headers["content-type"] == "text/plain; charset=utf-8"


async def test_router_answers_404_unknown_path_and_405_with_allow() -> None:
    """An unknown path is 404, a known path with another method is 405 listing the allowed ones."""
    with trio.fail_after(10):
        async with serving() as port:
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                assert (await client.request("GET", "/nope"))[0] == 404
                status, headers, _ = await client.request("DELETE", "/echo")
                assert status == 405
                assert headers["allow"] == "GET, POST"
                status, _, body = await client.request("GET", "/files/a/b")
                assert (status, body) == (200, b"GET /files/a/b? 0\n")


async def test_router_prefers_exact_path_over_prefix() -> None:
    """An exact route wins over a prefix route covering the same path; a longer prefix over a shorter."""

    async def tag(name: str, _: Request) -> Response:
        return Response.text(200, name)

    handle = router(
        [
            HttpRoute("GET", "/", partial(tag, "root"), prefix=True),
            HttpRoute("GET", "/a/", partial(tag, "a"), prefix=True),
            HttpRoute("GET", "/a/exact", partial(tag, "exact")),
        ]
    )

    async def get(path: str) -> bytes:
        return (await handle(Request(method="GET", path=path, query="", headers=(), body=b""))).body

    assert await get("/a/exact") == b"exact\n"
    assert await get("/a/other") == b"a\n"
    assert await get("/b") == b"root\n"


async def test_oversized_body_is_413_and_connection_closed() -> None:
    """A declared body over the limit is refused with 413 before it is read, and the connection closes."""
    with trio.fail_after(10):
        async with serving(max_body_bytes=100) as port:
            reply = await _raw(port, b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 101\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 413 ")
            assert b"connection: close" in reply.lower()


async def test_oversized_chunked_body_is_413() -> None:
    """A chunked body that grows over the limit is refused with 413 while it is read."""
    with trio.fail_after(10):
        async with serving(max_body_bytes=100) as port:
            chunk = b"64\r\n" + b"x" * 100 + b"\r\n"
            reply = await _raw(
                port, b"POST /echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n" + chunk + chunk
            )
            assert reply.startswith(b"HTTP/1.1 413 ")


async def test_malformed_request_is_400() -> None:
    """Garbage instead of a request line gets 400 and a closed connection, and the server keeps serving."""
    with trio.fail_after(10):
        async with serving() as port:
            reply = await _raw(port, b"this is not http\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 400 ")
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                assert (await client.request("GET", "/echo"))[0] == 200


async def test_handler_exception_is_500_logged_and_server_survives() -> None:
    """A handler that raises yields 500 and one error event; the same connection keeps working."""
    with trio.fail_after(10), capture_logs() as logs:
        async with serving(log=structlog.get_logger()) as port:
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                status, _, body = await client.request("GET", "/boom")
                assert (status, body) == (500, b"internal server error\n")
                assert (await client.request("GET", "/echo"))[0] == 200
    failures = [e for e in logs if e["event"] == "http_handler_failed"]
    assert len(failures) == 1
    assert failures[0]["path"] == "/boom"
    assert failures[0]["log_level"] == "error"


async def test_idle_connection_is_closed_after_timeout() -> None:
    """A connection that sends nothing is closed by the server once the idle timeout passes."""
    with trio.fail_after(10):
        async with serving(idle_timeout=0.2) as port:
            started = trio.current_time()
            assert await _raw(port, b"") == b""
            assert 0.2 <= trio.current_time() - started < 5


async def test_slow_request_body_gets_408() -> None:
    """A request whose body stalls past the idle timeout is answered 408 and closed."""
    with trio.fail_after(10):
        async with serving(idle_timeout=0.2) as port:
            reply = await _raw(port, b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\nabc")
            assert reply.startswith(b"HTTP/1.1 408 ")


async def test_expect_continue_is_honoured() -> None:
    """A client waiting for 100 Continue gets it, then the final response."""
    with trio.fail_after(10):
        async with serving() as port:
            stream = await trio.open_tcp_stream(LOOPBACK, port)
            async with stream:
                await stream.send_all(
                    b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n"
                )
                interim = await stream.receive_some(65536)
                assert interim.startswith(b"HTTP/1.1 100 ")
                await stream.send_all(b"abc")
                final = await stream.receive_some(65536)
                assert final.startswith(b"HTTP/1.1 200 ")


async def test_health_ready_and_metrics_endpoints() -> None:
    """healthz is 200, readyz follows the callback (503 then 200), metrics exposes the registry."""
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter("test_things", "Things counted by the test.", registry=registry)
    counter.inc(3)
    ready = False
    handler = router(health_routes(ready=lambda: ready, registry=registry))
    with trio.fail_after(10):
        async with serving(handler=handler) as port:
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                assert (await client.request("GET", "/healthz"))[0] == 200
                assert (await client.request("GET", "/livez"))[0] == 200
                assert (await client.request("GET", "/readyz"))[0] == 503
                ready = True
                assert (await client.request("GET", "/readyz"))[0] == 200
                status, headers, body = await client.request("GET", "/metrics")
                assert status == 200
                assert headers["content-type"] == prometheus_client.exposition.CONTENT_TYPE_LATEST
                assert b"test_things_total 3.0" in body
                assert f'nodetaskd_build_info{{version="{package_version()}"}} 1.0'.encode() in body


async def test_every_metrics_endpoint_serves_the_build_info_and_process_metrics_beside_its_registry() -> None:
    """Two endpoints serving one registry both show the version gauge once, the process's memory, CPU and file
    descriptors, and the registry's own metrics."""
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Gauge("test_level", "A level set by the test.", registry=registry).set(2)
    for routes in (health_routes(ready=lambda: True, registry=registry) for _ in range(2)):
        with trio.fail_after(10):
            async with serving(handler=router(routes)) as port:
                client = Client(await trio.open_tcp_stream(LOOPBACK, port))
                async with client.stream:
                    status, _, body = await client.request("GET", "/metrics")
        assert status == 200
        samples = [line for line in body.decode().splitlines() if not line.startswith("#")]
        assert samples.count(f'nodetaskd_build_info{{version="{package_version()}"}} 1.0') == 1
        assert "test_level 2.0" in samples
        process = {line.split()[0]: float(line.split()[1]) for line in samples if line.startswith("process_")}
        assert process["process_resident_memory_bytes"] > 1 << 20, process
        assert 0 < process["process_open_fds"] <= process["process_max_fds"], process
        assert "process_cpu_seconds_total" in process, process


async def test_tls_serves_and_a_failed_handshake_leaves_other_connections_alone(tmp_path: Path) -> None:
    """HTTPS works with the generated certificate; a plain-text peer on the TLS port breaks only itself."""
    cert = generate_serving_certificate(tmp_path, dns_names=["localhost"], ip_addresses=[LOOPBACK])
    client_context = ssl.create_default_context(cadata=cert.ca_bundle.decode())
    with trio.fail_after(10), capture_logs() as logs:
        async with serving(ssl_context=server_ssl_context(cert), log=structlog.get_logger()) as port:
            good = Client(
                trio.SSLStream(await trio.open_tcp_stream(LOOPBACK, port), client_context, server_hostname=LOOPBACK)
            )
            async with good.stream:
                assert (await good.request("GET", "/echo"))[0] == 200
                # A plain HTTP request to the TLS port: its handshake fails, its connection is closed.
                reply = await _raw(port, b"GET /echo HTTP/1.1\r\nhost: t\r\n\r\n")
                assert not reply.startswith(b"HTTP/1.1 200")
                # The TLS connection opened before is unaffected.
                assert (await good.request("GET", "/echo"))[0] == 200
    assert any(e["event"] == "http_connection_broken" for e in logs)
    assert not any(e["log_level"] == "error" for e in logs)


async def test_a_tls_context_function_is_asked_per_connection_and_open_ones_keep_theirs(tmp_path: Path) -> None:
    """Given a function, the server takes the context it returns as each connection comes: a certificate
    swapped in reaches new connections, and one opened before goes on with the old one."""
    first = generate_serving_certificate(tmp_path / "a", dns_names=["localhost"], ip_addresses=[LOOPBACK])
    second = generate_serving_certificate(tmp_path / "b", dns_names=["localhost"], ip_addresses=[LOOPBACK])
    contexts = [server_ssl_context(first)]
    client_context = ssl.create_default_context(cadata=(first.ca_bundle + second.ca_bundle).decode())

    async def connect(port: int) -> tuple[Client, int]:
        stream = trio.SSLStream(await trio.open_tcp_stream(LOOPBACK, port), client_context, server_hostname=LOOPBACK)
        await stream.do_handshake()
        der = stream.getpeercert(binary_form=True)
        assert der is not None
        return Client(stream), x509.load_der_x509_certificate(der).serial_number

    def serial(cert: ServingCertificate) -> int:
        return x509.load_pem_x509_certificate(cert.cert_file.read_bytes()).serial_number

    with trio.fail_after(10):
        async with serving(ssl_context=lambda: contexts[-1]) as port:
            old, old_serial = await connect(port)
            async with old.stream:
                assert (await old.request("GET", "/echo"))[0] == 200
                contexts.append(server_ssl_context(second))
                new, new_serial = await connect(port)
                async with new.stream:
                    assert (await new.request("GET", "/echo"))[0] == 200
                assert (await old.request("GET", "/echo"))[0] == 200
    assert (old_serial, new_serial) == (serial(first), serial(second))


async def test_port_zero_reports_the_bound_port() -> None:
    """Starting on port 0 reports the real port, which accepts connections."""
    with trio.fail_after(10):
        async with serving() as port:
            assert port > 0
            stream = await trio.open_tcp_stream(LOOPBACK, port)
            await stream.aclose()


@pytest.mark.parametrize("path", ["/echo", "/boom"])
async def test_head_request_gets_no_body(path: str) -> None:
    """A HEAD request (here answered 405 or routed) never gets a body that would corrupt the stream."""
    with trio.fail_after(10):
        async with serving() as port:
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                status, _, body = await client.request("HEAD", path)
                assert (status, body) == (405, b"")
                assert (await client.request("GET", "/echo"))[0] == 200


def test_generated_certificate_names_its_hosts_and_loads_back(tmp_path: Path) -> None:
    """The serving certificate carries the DNS names and IPs asked for, is signed by the bundle's CA, and reloads."""

    cert = generate_serving_certificate(tmp_path, dns_names=["webhook.local"], ip_addresses=[LOOPBACK, "::1"])
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600
    leaf = x509.load_pem_x509_certificate(cert.cert_file.read_bytes())
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["webhook.local"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [LOOPBACK, "::1"]
    ca = x509.load_pem_x509_certificate(cert.ca_bundle)
    leaf.verify_directly_issued_by(ca)
    loaded = load_serving_certificate(cert.cert_file, cert.key_file, ca_file=tmp_path / "ca.crt")
    assert loaded == cert


def test_loading_a_key_of_another_certificate_fails_naming_the_files(tmp_path: Path) -> None:
    """A key that does not belong to the certificate is refused before any server starts."""
    first = generate_serving_certificate(tmp_path / "a", dns_names=["a"])
    second = generate_serving_certificate(tmp_path / "b", dns_names=["b"])
    with pytest.raises(TlsError, match="does not belong"):
        load_serving_certificate(first.cert_file, second.key_file)
    with pytest.raises(TlsError, match="cannot read"):
        load_serving_certificate(tmp_path / "missing.crt", first.key_file)


async def test_connections_beyond_max_connections_are_closed_at_once_and_counted() -> None:
    """A connection past the limit is closed before a byte is read; once one ends, a new one is served."""
    refused: list[int] = []
    with trio.fail_after(10):
        async with serving(max_connections=2, on_refused=lambda: refused.append(1)) as port:
            clients = [Client(await trio.open_tcp_stream(LOOPBACK, port)) for _ in range(2)]
            for client in clients:
                assert (await client.request("GET", "/echo"))[0] == 200  # both are being served
            # Closed at once: an admitted connection would stay open for the 30 s idle timeout.
            assert await _raw(port, b"") == b""
            assert refused == [1]
            await clients[0].stream.aclose()
            while True:  # until the server has seen the first connection end
                try:
                    reply = await _raw(port, b"GET /echo HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                except trio.BrokenResourceError:  # refused while our request was on its way
                    reply = b""
                if reply:
                    break
                await trio.sleep(0.01)
            assert reply.startswith(b"HTTP/1.1 200 ")
            await clients[1].stream.aclose()


async def test_each_failed_handler_is_reported_to_on_error() -> None:
    """The server's owner can count handler failures (the hub exports them as a metric)."""
    errors: list[int] = []
    with trio.fail_after(10):
        async with serving(on_error=lambda: errors.append(1)) as port:
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                assert (await client.request("GET", "/boom"))[0] == 500
                assert (await client.request("GET", "/echo"))[0] == 200
    assert errors == [1]


# -------------------------------------------------------------------------------------------- streaming


def _streaming(stream: Callable[[Send], Awaitable[None]]) -> Handler:
    async def handle(_: Request) -> Response:
        return Response.streamed(200, stream, content_type="application/json")

    return router([HttpRoute("GET", "/stream", handle), HttpRoute("HEAD", "/stream", handle), *ROUTES])


async def _read_until(stream: trio.abc.Stream, marker: bytes, received: bytes = b"") -> bytes:
    while marker not in received:
        chunk = await stream.receive_some(65536)
        assert chunk, f"connection closed before {marker!r}; got {received!r}"
        received += chunk
    return received


async def test_a_streamed_body_goes_out_piece_by_piece_then_the_connection_closes() -> None:
    """Each piece reaches the client as it is sent (chunked); the body then ends and the connection closes."""
    go_on = trio.Event()

    async def two_pieces(send: Send) -> None:
        await send(b'{"n":1}\n')
        await go_on.wait()
        await send(b'{"n":2}\n')

    with trio.fail_after(10):
        async with serving(handler=_streaming(two_pieces)) as port:
            stream = await trio.open_tcp_stream(LOOPBACK, port)
            async with stream:
                await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
                first = await _read_until(stream, b'{"n":1}\n')
                assert b'{"n":2}' not in first
                head = first.split(b"\r\n\r\n")[0].lower()
                assert b"transfer-encoding: chunked" in head
                assert b"connection: close" in head
                assert b"content-type: application/json" in head
                go_on.set()
                rest = await _read_until(stream, b"0\r\n\r\n")
                assert b'{"n":2}\n' in rest
                assert await stream.receive_some(65536) == b""


async def test_a_stream_is_cancelled_when_its_client_leaves() -> None:
    """A client closing its end mid-stream cancels the stream at once instead of at its next piece."""
    left = trio.Event()

    async def forever(send: Send) -> None:
        await send(b"hello\n")
        try:
            await trio.sleep_forever()
        finally:
            left.set()

    with trio.fail_after(10):
        async with serving(handler=_streaming(forever)) as port:
            stream = await trio.open_tcp_stream(LOOPBACK, port)
            await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
            await _read_until(stream, b"hello\n")
            await stream.aclose()
            await left.wait()


async def test_a_failing_stream_ends_its_body_short_and_the_server_goes_on() -> None:
    """A stream that raises leaves its body unterminated (the client sees it cut), is logged and counted."""
    errors: list[None] = []

    async def broken(send: Send) -> None:
        await send(b"part\n")
        raise RuntimeError("stream bug")

    with trio.fail_after(10), capture_logs() as logs:
        async with serving(handler=_streaming(broken), on_error=lambda: errors.append(None)) as port:
            reply = await _raw(port, b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 200 ")
            assert b"part\n" in reply
            assert not reply.endswith(b"0\r\n\r\n")
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                assert (await client.request("GET", "/echo"))[0] == 200
    assert [e["log_level"] for e in logs if e["event"] == "http_stream_failed"] == ["error"]
    assert len(errors) == 1


async def test_a_head_request_gets_a_streams_head_only() -> None:
    """HEAD on a streamed resource answers the head and an empty body, without running the stream."""
    ran: list[None] = []

    async def stream(send: Send) -> None:
        ran.append(None)

    with trio.fail_after(10):
        async with serving(handler=_streaming(stream)) as port:
            reply = await _raw(port, b"HEAD /stream HTTP/1.1\r\nhost: t\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert not ran


async def test_connections_beyond_a_peers_share_are_closed_at_once_while_other_peers_are_served() -> None:
    """One address past max_connections_per_peer is closed before a byte is read; another address is still served."""
    refused: list[str] = []
    with trio.fail_after(10):
        async with serving(
            max_connections=10,
            max_connections_per_peer=2,
            on_refused=lambda: refused.append("total"),
            on_refused_per_peer=lambda: refused.append("per_peer"),
        ) as port:
            clients = [Client(await trio.open_tcp_stream(LOOPBACK, port, local_address="127.0.0.2")) for _ in range(2)]
            for client in clients:
                assert (await client.request("GET", "/echo"))[0] == 200
            crowding = await trio.open_tcp_stream(LOOPBACK, port, local_address="127.0.0.2")
            async with crowding:
                assert await crowding.receive_some(100) == b""  # closed at once: no request was even sent
            other = Client(await trio.open_tcp_stream(LOOPBACK, port, local_address="127.0.0.3"))
            async with other.stream:
                assert (await other.request("GET", "/echo"))[0] == 200
            for client in clients:
                await client.stream.aclose()
    assert refused == ["per_peer"]


async def test_a_connection_that_sends_no_request_head_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    """A silent connection, a trickled head and a TLS connection that never handshakes are closed before the idle
    timeout."""
    cert = generate_serving_certificate(tmp_path, dns_names=["localhost"], ip_addresses=[LOOPBACK])
    with trio.fail_after(20):  # the idle timeout is a minute: only the header timeout can close them in time
        async with serving(header_timeout=0.2, idle_timeout=60) as port:
            assert await _raw(port, b"") == b""
            assert await _raw(port, b"GET /echo HTTP/1.1\r\nhost:") == b""
        async with serving(ssl_context=server_ssl_context(cert), header_timeout=0.2, idle_timeout=60) as port:
            assert await _raw(port, b"") == b""


async def test_a_kept_alive_connection_waits_for_its_next_request_by_the_idle_timeout() -> None:
    """The header timeout bounds only the first request: between requests a connection may idle longer."""
    with trio.fail_after(20):
        async with serving(header_timeout=0.1, idle_timeout=60) as port:
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                assert (await client.request("GET", "/echo"))[0] == 200
                await trio.sleep(0.5)
                assert (await client.request("GET", "/echo"))[0] == 200


async def test_request_bodies_past_what_the_server_holds_at_once_get_503_until_one_is_answered() -> None:
    """Bodies held across connections are capped: one more gets 503 with retry-after, and room returns once answered."""
    entered, release = trio.Event(), trio.Event()

    async def hold(request: Request) -> Response:
        entered.set()
        await release.wait()
        return Response.text(200, f"held {len(request.body)}")

    handler = router((*ROUTES, HttpRoute("POST", "/hold", hold)))
    with trio.fail_after(10):
        async with serving(handler=handler, max_body_bytes=100, max_buffered_bytes=100) as port:
            async with trio.open_nursery() as nursery:
                holder = Client(await trio.open_tcp_stream(LOOPBACK, port))
                answers: list[int] = []

                async def held() -> None:
                    answers.append((await holder.request("POST", "/hold", b"x" * 80))[0])

                nursery.start_soon(held)
                await entered.wait()
                reply = await _raw(port, b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 30\r\n\r\n" + b"y" * 30)
                assert reply.startswith(b"HTTP/1.1 503 ")
                assert b"retry-after: 1" in reply.lower()
                chunked = b"POST /echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n1e\r\n" + b"z" * 30
                assert (await _raw(port, chunked + b"\r\n0\r\n\r\n")).startswith(b"HTTP/1.1 503 ")
                release.set()
            assert answers == [200]
            await holder.stream.aclose()
            client = Client(await trio.open_tcp_stream(LOOPBACK, port))
            async with client.stream:
                assert (await client.request("POST", "/echo", b"y" * 30))[0] == 200
