"""Where a Task may make the device connect (httpServer, network.probe): real sockets on loopback, and a
resolver that answers only what a test says (the rules themselves: test_processor_reach_rules.py)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from functools import partial

import msgspec
import pytest
import structlog
import trio

from roles.common.config import ConfigError, DiagnosisConfig, EdgeConfig, LocalApiConfig, load_config
from roles.common.httpserver import HttpRoute, Request, Response, router, serve_http
from roles.edge import processors
from schemas.processors import Builtin, HTTPServer, Processor
from tests.unit.roles.edge.processors.doubles import make_env

LOOPBACK = "127.0.0.1"
REQUEST = {"node": "edge-1"}


class Resolver(trio.abc.HostnameResolver):
    """Answers the names of ``names`` with their address, any other name with "not known"; records each name."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = dict(names)
        self.asked: list[str] = []

    async def getaddrinfo(  # type: ignore[override]
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[str, int]]]:
        name = (host or b"").decode()
        self.asked.append(name)
        if name not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        assert isinstance(port, int)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (self.names[name], port))]

    async def getnameinfo(self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int) -> tuple[str, str]:
        raise NotImplementedError


@pytest.fixture
async def resolver() -> Resolver:
    """Installed for this test's run: every name any code here resolves goes through it."""
    fake = Resolver({"app.example": LOOPBACK})
    trio.socket.set_custom_hostname_resolver(fake)
    return fake


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[int, list[Request]]]:
    """A real HTTP server on loopback answering every POST to / with an object; its port and what it got."""
    received: list[Request] = []

    async def answer(request: Request) -> Response:
        received.append(request)
        return Response.json(200, msgspec.json.encode({"ok": "yes"}))

    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            partial(
                serve_http, router([HttpRoute("POST", "/", answer)]), host=LOOPBACK, port=0, log=structlog.get_logger()
            )
        )
        yield port, received
        nursery.cancel_scope.cancel()


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A loopback listener that nobody accepts on: a connection made to it waits in its backlog."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def connected_to(listener: socket.socket) -> bool:
    """Whether anything connected to ``listener`` (a connection waits in its backlog until accepted)."""
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def post(port: int, address: str | None = None) -> Processor:
    return Processor(http_server=HTTPServer(address=address, port=port), timeout_seconds=10)


PROBE = Processor(builtin=Builtin(name="network.probe"), timeout_seconds=10)


# ----------------------------------------------------------------------------------------- httpServer


async def test_a_post_to_a_loopback_port_the_device_does_not_list_is_refused_before_connecting() -> None:
    """The device's ports are opt-in: a Task could otherwise write into the etcd or API server of the device."""
    with trio.fail_after(10):
        async with serving() as (port, received):
            refused = await processors.run(post(port), REQUEST, make_env())
            allowed = await processors.run(post(port), REQUEST, make_env(loopback_ports=(port,)))
    assert not refused.succeeded
    assert refused.reason == (
        f"POST http://127.0.0.1:{port}/ refused: '127.0.0.1' is the device itself, and its port {port}"
        " is not in diagnosis.loopbackPorts of this device's config"
    )
    assert allowed.succeeded, allowed.reason
    assert len(received) == 1


async def test_a_post_to_the_agents_own_port_is_refused_even_when_listed() -> None:
    """The local API (the agent's own port) is never a Task's target, whatever loopbackPorts says."""
    with trio.fail_after(10):
        async with serving() as (port, received):
            env = make_env(loopback_ports=(port,), own_ports=(port,))
            hosts = ("localhost", "::ffff:127.0.0.1")
            outcomes = [await processors.run(post(port, host), REQUEST, env) for host in hosts]
    assert [o.succeeded for o in outcomes] == [False, False]
    assert f"port {port} is served by the agent itself (localApi.port): no Task may reach it" in outcomes[0].reason
    assert received == []


async def test_a_listed_name_that_resolves_to_the_device_gets_the_devices_rules(resolver: Resolver) -> None:
    """httpHosts lists app.example, which resolves to 127.0.0.1: its port must still be in loopbackPorts."""
    config = DiagnosisConfig(http_hosts=("app.example",))
    with trio.fail_after(10):
        async with serving() as (port, received):
            refused = await processors.run(post(port, "app.example"), REQUEST, make_env(config=config))
            allowed = await processors.run(
                post(port, "app.example"), REQUEST, make_env(config=config, loopback_ports=(port,))
            )
    assert refused.reason == (
        f"POST http://app.example:{port}/: refused: 'app.example' resolves to the device itself (127.0.0.1), and"
        f" its port {port} is not in diagnosis.loopbackPorts of this device's config"
    )
    assert allowed.succeeded, allowed.reason
    assert len(received) == 1


async def test_a_post_to_an_unlisted_name_is_refused_without_resolving_it(resolver: Resolver) -> None:
    """A name nobody listed is not looked up: the refusal names diagnosis.httpHosts."""
    outcome = await processors.run(post(80, "etcd.example"), REQUEST, make_env())
    assert "'etcd.example' is not the device itself, and diagnosis.httpHosts" in outcome.reason
    assert resolver.asked == []


# ------------------------------------------------------------------------------------------ network.probe


async def test_a_probe_of_a_loopback_port_the_device_does_not_list_is_refused_before_connecting(
    listening: socket.socket,
) -> None:
    """network.probe is no port scanner of the device: a port not in loopbackPorts is refused, nothing connects."""
    port = int(listening.getsockname()[1])
    request = {"network.probe.targets": f"{LOOPBACK}:{port},localhost:2379"}
    with trio.fail_after(10):
        outcome = await processors.run(PROBE, request, make_env())
    assert not outcome.succeeded
    assert outcome.reason == (
        "network.probe.targets names 2 targets this device does not allow:"
        f" 127.0.0.1:{port}: '127.0.0.1' is the device itself, and its port {port} is not in diagnosis.loopbackPorts"
        " of this device's config;"
        " localhost:2379: 'localhost' is the device itself, and its port 2379 is not in diagnosis.loopbackPorts"
        " of this device's config"
    )
    assert outcome.results == {}
    assert not connected_to(listening)


async def test_a_probe_of_an_unlisted_host_is_refused_without_resolving_it(resolver: Resolver) -> None:
    """No DNS oracle either: a name probeHosts does not list is refused before any look-up (httpHosts is not
    probeHosts: a POST's list does not open probes)."""
    request = {"network.probe.targets": "etcd.example:2379,registry.example:5000"}
    outcome = await processors.run(PROBE, request, make_env(config=DiagnosisConfig(http_hosts=("etcd.example",))))
    assert not outcome.succeeded
    assert "etcd.example:2379: 'etcd.example' is not the device itself, and diagnosis.probeHosts" in outcome.reason
    assert "registry.example:5000: 'registry.example' is not the device itself, and diagnosis.probeHosts" in (
        outcome.reason
    )
    assert resolver.asked == []


async def test_one_refused_target_refuses_the_whole_probe(resolver: Resolver, listening: socket.socket) -> None:
    """Allowed targets are not probed when another is refused: a Task learns nothing but the refusal."""
    port = int(listening.getsockname()[1])
    request = {"network.probe.targets": f"{LOOPBACK}:{port},elsewhere.example:80"}
    outcome = await processors.run(PROBE, request, make_env(loopback_ports=(port,)))
    assert outcome.reason.startswith("network.probe.targets names 1 target this device does not allow: elsewhere.ex")
    assert resolver.asked == []
    assert not connected_to(listening)


async def test_a_listed_name_resolving_to_the_device_is_probed_only_at_a_listed_port(
    resolver: Resolver, listening: socket.socket
) -> None:
    """probeHosts lists app.example (127.0.0.1 here): its probe needs the port in loopbackPorts too."""
    port = int(listening.getsockname()[1])
    config = DiagnosisConfig(probe_hosts=("App.Example.",))
    request = {"network.probe.targets": f"app.example:{port}"}
    with trio.fail_after(10):
        refused = await processors.run(PROBE, request, make_env(config=config))
        refused_connected = connected_to(listening)
        allowed = await processors.run(PROBE, request, make_env(config=config, loopback_ports=(port,)))
    assert refused.results[f"network.probe.app.example:{port}.result"] == (
        f"refused: 'app.example' resolves to the device itself (127.0.0.1), and its port {port} is not in"
        " diagnosis.loopbackPorts of this device's config"
    )
    assert not refused_connected
    assert allowed.succeeded, allowed.reason
    assert allowed.results[f"network.probe.app.example:{port}.result"] == "ok"
    assert resolver.asked == ["app.example", "app.example"]


# ------------------------------------------------------------------------------------------ the config


def test_the_config_refuses_a_probe_host_with_a_scheme_or_port() -> None:
    """diagnosis.probeHosts holds host names or addresses, like httpHosts; a URL or host:port is named."""
    assert DiagnosisConfig(probe_hosts=("10.0.0.5", "fe80::1", "registry.local")).probe_hosts
    with pytest.raises(ValueError, match=r"diagnosis\.probeHosts: 'registry\.local:5000'"):
        DiagnosisConfig(probe_hosts=("registry.local:5000",))


@pytest.mark.parametrize("port", [0, 65536])
def test_the_config_refuses_a_loopback_port_out_of_range(port: int) -> None:
    """A port is 1-65535; the error names diagnosis.loopbackPorts."""
    with pytest.raises(ConfigError, match=r"diagnosis\.loopbackPorts"):
        load_config("edge", None, {"diagnosis": {"loopbackPorts": [port]}})


def test_the_config_refuses_listing_the_local_apis_port() -> None:
    """The agent's own port in loopbackPorts is a mistake reported at start, naming both settings."""
    local_api = LocalApiConfig(enabled=True, port=10261)
    with pytest.raises(ValueError, match=r"loopbackPorts lists 10261, a port of this agent's \(localApi.port"):
        EdgeConfig(local_api=local_api, diagnosis=DiagnosisConfig(loopback_ports=(8080, 10261)))
    assert EdgeConfig(local_api=local_api).served_ports == (10261,)
    assert EdgeConfig(local_api=LocalApiConfig(port=10261)).served_ports == ()
