"""The httpServer processor against real HTTP servers on loopback, and its pure decisions."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import msgspec
import pytest
import structlog
import trio
from hypothesis import given
from hypothesis import strategies as st

from roles.common.config import DiagnosisConfig
from roles.common.httpserver import HttpRoute, Request, Response, Send, router, serve_http
from roles.common.tls import generate_serving_certificate, server_ssl_context
from roles.edge import processors
from roles.edge.processors.http import MAX_BODY_BYTES, target_of, verdict
from schemas.processors import HTTPServer, Processor
from tests.unit.roles.edge.processors.doubles import Events, make_env
from tools.ports import held

LOOPBACK = "127.0.0.1"
REQUEST = {"node": "edge-1", "task.name": "t1", "disk.path": "/var"}


@asynccontextmanager
async def serving(
    handler: Callable[[Request], Awaitable[Response]], *, port: int = 0, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[int]:
    """A real HTTP server on loopback answering every POST to /diag with ``handler``."""
    async with trio.open_nursery() as nursery:
        bound: int = await nursery.start(
            partial(
                serve_http,
                router([HttpRoute("POST", "/diag", handler)]),
                host=LOOPBACK,
                port=port,
                log=structlog.get_logger(),
                ssl_context=ssl_context,
            )
        )
        yield bound
        nursery.cancel_scope.cancel()


def http(port: int, *, timeout: int = 10, scheme: str = "http") -> Processor:
    return Processor(http_server=HTTPServer(port=port, path="/diag", scheme=scheme), timeout_seconds=timeout)


@pytest.fixture
def refused() -> Iterator[int]:
    """A loopback port held, not listening, for the test: connecting to it is refused until a server binds it."""
    with held() as port:
        yield port


async def test_a_200_with_an_object_of_strings_succeeds_with_it_as_results() -> None:
    """The request data arrives as a JSON object; the answer's object becomes the results."""
    received: list[Request] = []

    async def answer(request: Request) -> Response:
        received.append(request)
        return Response.json(200, msgspec.json.encode({"disk.usage": "42", "note": "ok"}))

    with trio.fail_after(10):
        async with serving(answer) as port:
            outcome = await processors.run(http(port), REQUEST, make_env(loopback_ports=(port,)))
    assert outcome.succeeded, outcome.reason
    assert outcome.results == {"disk.usage": "42", "note": "ok"}
    assert msgspec.json.decode(received[0].body) == REQUEST
    assert received[0].header("content-type") == "application/json"


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (500, b"database on fire", "answered 500: database on fire"),
        (404, b"", "answered 404: (no body)"),
        (200, b"<html>not json</html>", "answered 200 with a body that is not JSON"),
        (200, b'{"count": 3}', "not an object of strings: Expected `str`, got `int` - at `$[...]`"),
        (200, b'["a"]', "not an object of strings: Expected `object`, got `array`"),
    ],
)
async def test_any_other_answer_fails_with_what_was_wrong(status: int, body: bytes, expected: str) -> None:
    """A non-200 status, a body that is not JSON, or JSON that is not an object of strings fails the run."""

    async def answer(_: Request) -> Response:
        return Response(status=status, body=body, content_type="application/json")

    with trio.fail_after(10):
        async with serving(answer) as port:
            outcome = await processors.run(http(port), REQUEST, make_env(loopback_ports=(port,)))
    assert not outcome.succeeded
    assert expected in outcome.reason
    assert f"http://127.0.0.1:{port}/diag" in outcome.reason


async def test_an_oversized_body_fails_without_being_read_whole() -> None:
    """A body announced over 2 MiB fails at once; a chunked one fails when it passes 2 MiB."""
    sent = 0

    async def announced(_: Request) -> Response:
        return Response.json(200, b'"' + b"x" * MAX_BODY_BYTES + b'"')

    async def chunked(_: Request) -> Response:
        async def stream(send: Send) -> None:
            nonlocal sent
            while True:  # endless: only the client's refusal ends it
                await send(b"x" * 65536)
                sent += 65536

        return Response.streamed(200, stream, content_type="application/json")

    with trio.fail_after(20):
        async with serving(announced) as port:
            first = await processors.run(http(port), REQUEST, make_env(loopback_ports=(port,)))
        async with serving(chunked) as port:
            second = await processors.run(http(port), REQUEST, make_env(loopback_ports=(port,)))
    assert not first.succeeded
    assert f"the answer's body ({MAX_BODY_BYTES + 2} bytes) exceeds {MAX_BODY_BYTES} bytes" in first.reason
    assert not second.succeeded
    assert f"the answer's body exceeds {MAX_BODY_BYTES} bytes" in second.reason


async def test_a_refused_connection_is_retried_until_the_server_is_up(refused: int) -> None:
    """Connection refused is a transport error: the processor backs off and tries again within the timeout."""
    port = refused
    events = Events()
    outcomes: list[processors.ProcessorOutcome] = []
    done = trio.Event()

    async def answer(_: Request) -> Response:
        return Response.json(200, b'{"up": "yes"}')

    async def call() -> None:
        outcomes.append(await processors.run(http(port, timeout=30), REQUEST, make_env(events, loopback_ports=(port,))))
        done.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await events.event("diagnosis_http_retry").wait()
            async with serving(answer, port=port):
                await done.wait()
    assert outcomes[0].succeeded, outcomes[0].reason
    assert outcomes[0].results == {"up": "yes"}
    assert "connection refused" in events.named("diagnosis_http_retry")[0]["error"]


async def test_a_server_that_never_comes_up_fails_before_the_timeout_with_the_last_error(refused: int) -> None:
    """Retries stop when the next one would pass the timeout; the reason has the error and the attempts."""
    with trio.fail_after(20):
        outcome = await processors.run(http(refused, timeout=2), REQUEST, make_env(loopback_ports=(refused,)))
    assert not outcome.succeeded
    assert "connection refused (" in outcome.reason
    assert "attempts within timeoutSeconds)" in outcome.reason


async def test_a_connection_closed_without_an_answer_is_retried() -> None:
    """A server that accepts and closes at once is a transport error, retried like a refusal."""
    events = Events()

    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.aclose()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, hang_up, 0, host=LOOPBACK))
            port = listeners[0].socket.getsockname()[1]
            outcome = await processors.run(http(port, timeout=2), REQUEST, make_env(events, loopback_ports=(port,)))
            nursery.cancel_scope.cancel()
    assert not outcome.succeeded
    assert "attempts within timeoutSeconds)" in outcome.reason
    assert events.named("diagnosis_http_retry")


async def test_a_server_that_never_answers_fails_on_the_operation_timeout(black_hole_port: int) -> None:
    """The operation's timeoutSeconds bounds the whole run; the reason names it."""
    with trio.fail_after(20):
        outcome = await processors.run(
            http(black_hole_port, timeout=1), REQUEST, make_env(loopback_ports=(black_hole_port,))
        )
    assert not outcome.succeeded
    assert outcome.reason == "timed out after 1 s (the operation's timeoutSeconds)"


@pytest.fixture
def black_hole_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


async def test_a_host_other_than_the_device_is_refused_unless_listed() -> None:
    """Another host than the device is called only if diagnosis.httpHosts lists it; the refusal names that."""
    processor = Processor(http_server=HTTPServer(address="192.0.2.10", port=80), timeout_seconds=5)
    outcome = await processors.run(processor, REQUEST, make_env())
    assert not outcome.succeeded
    assert "'192.0.2.10'" in outcome.reason
    assert "diagnosis.httpHosts" in outcome.reason


async def test_https_verifies_the_certificate_against_the_system_trust_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An untrusted certificate fails at once naming the TLS error; once its CA is trusted, the run succeeds."""
    cert = generate_serving_certificate(tmp_path, dns_names=["localhost"], ip_addresses=[LOOPBACK])

    async def answer(_: Request) -> Response:
        return Response.json(200, b'{"tls": "yes"}')

    with trio.fail_after(20):
        async with serving(answer, ssl_context=server_ssl_context(cert)) as port:
            untrusted = await processors.run(http(port, scheme="https"), REQUEST, make_env(loopback_ports=(port,)))
            # OpenSSL reads SSL_CERT_FILE when a default context loads the system's trust store.
            monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.crt"))
            trusted = await processors.run(http(port, scheme="https"), REQUEST, make_env(loopback_ports=(port,)))
    assert not untrusted.succeeded
    assert "TLS certificate verification failed: unable to get local issuer certificate" in untrusted.reason
    assert trusted.succeeded, trusted.reason
    assert trusted.results == {"tls": "yes"}


# ------------------------------------------------------------------------------------------ pure parts


@given(st.dictionaries(st.text(), st.text()))
def test_a_200_with_any_object_of_strings_is_success_with_that_object(results: dict[str, str]) -> None:
    """Whatever strings the object has, they are the results unchanged."""
    outcome = verdict("http://h:1/", 200, msgspec.json.encode(results))
    assert outcome.succeeded
    assert outcome.results == results


@given(st.integers(min_value=100, max_value=599).filter(lambda s: s != 200), st.binary(max_size=2000))
def test_any_status_but_200_is_failure_with_the_status_and_a_clipped_body(status: int, body: bytes) -> None:
    """The reason quotes the status and at most 512 characters of the body."""
    outcome = verdict("http://h:1/", status, body)
    assert not outcome.succeeded
    assert outcome.reason.startswith(f"POST http://h:1/ answered {status}: ")
    assert len(outcome.reason) < 600


def test_absent_address_and_port_mean_the_device_and_the_scheme_default() -> None:
    """KubeDiag's default target is the node itself; the port defaults to the scheme's."""
    assert target_of(HTTPServer()).url == "http://127.0.0.1:80/"
    assert target_of(HTTPServer(scheme="https", path="x")).url == "https://127.0.0.1:443/x"
    assert target_of(HTTPServer(address="::1", port=8090)).url == "http://[::1]:8090/"
    with pytest.raises(ValueError, match=r"httpServer\.scheme 'ftp'"):
        target_of(HTTPServer(scheme="ftp"))


def test_the_config_refuses_a_host_with_a_scheme_or_port() -> None:
    """diagnosis.httpHosts holds host names or addresses; a URL or host:port is named in the error."""
    assert DiagnosisConfig(http_hosts=("10.0.0.5", "fe80::1", "metrics.local")).http_hosts
    with pytest.raises(ValueError, match=r"diagnosis\.httpHosts: 'http://x'"):
        DiagnosisConfig(http_hosts=("http://x",))
    with pytest.raises(ValueError, match=r"diagnosis\.httpHosts: 'x:80'"):
        DiagnosisConfig(http_hosts=("x:80",))
