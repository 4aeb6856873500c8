"""Real hub and controller processes take up a rotated certificate without a restart, and keep theirs on a broken one.

Each role mounts its certificate as the kubelet mounts a Secret (``..data`` swapped atomically,
:mod:`tests.unit.containers.secret_volume`) and looks at it every 0.2 s (``tlsReloadInterval``). What the
processes serve is read from TLS handshakes; what they refused, from their JSON logs.
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
import trio
import trio_websocket
from cryptography import x509

from nodetask import messages
from nodetask.messages import Hello, Welcome
from roles.common.tls import CA_FILE, CERT_FILE, KEY_FILE
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.objects import kubectl, unique
from tests.unit.containers.secret_volume import Pem, SecretVolume, make_pem
from tools.ports import free_port
from tools.processes import role_command
from tools.provision.controlplane import ControlPlaneError

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
RELOAD_INTERVAL = 0.2


@dataclass
class RoleProcess:
    """A ``nodetaskd`` process logging JSON to stderr, read into :attr:`events` as it runs."""

    process: anyio.abc.Process
    events: list[dict[str, Any]] = field(default_factory=list)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    async def read_logs(self) -> None:
        assert self.process.stderr is not None
        pending = b""
        async for chunk in self.process.stderr:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    self.events.append({"event": "not_json", "line": line.decode(errors="replace")})


@asynccontextmanager
async def role_process(role: str, config: dict[str, object], directory: Path) -> AsyncIterator[RoleProcess]:
    """``nodetaskd --role=<role>`` with ``config`` until the block ends, then SIGTERM (exit 0 expected)."""
    path = directory / f"{role}.yaml"
    path.write_bytes(msgspec.yaml.encode({**config, "logFormat": "json"}))
    process = await anyio.open_process(role_command(role, path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    running = RoleProcess(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.read_logs)
            yield running
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(15):
                assert await process.wait() == 0, running.events[-5:]
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()


def _client(*pems: Pem) -> ssl.SSLContext:
    """A client trusting the CAs of ``pems`` (and checking the host name, 127.0.0.1)."""
    return ssl.create_default_context(cadata=b"".join(p.ca for p in pems).decode())


async def served_serial(port: int, client: ssl.SSLContext) -> int:
    """The serial of the certificate a new TLS connection to ``port`` is shown."""
    with trio.fail_after(10):
        stream = trio.SSLStream(await trio.open_tcp_stream(LOOPBACK, port), client, server_hostname=LOOPBACK)
        async with stream:
            await stream.do_handshake()
            der = stream.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def until(check: Callable[[], Awaitable[bool]], *, what: str, limit_s: float = 30) -> None:
    """Wait until ``check()`` is true; fail naming ``what`` after ``limit_s`` seconds."""
    with trio.move_on_after(limit_s):
        while True:
            if await check():
                return
            await trio.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {what}")


class KeptConnection:
    """One HTTPS connection kept open (keep-alive) across requests, used from worker threads."""

    def __init__(self, port: int, client: ssl.SSLContext) -> None:
        self._conn = http.client.HTTPSConnection(LOOPBACK, port, context=client, timeout=10)
        self._sock: object = None

    def _get(self, path: str) -> tuple[int, int]:
        self._conn.request("GET", path)
        answer = self._conn.getresponse()
        answer.read()
        sock = self._conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        assert self._sock in (None, sock), "the connection was opened again"
        self._sock = sock
        der = sock.getpeercert(binary_form=True)
        assert der is not None
        return answer.status, x509.load_der_x509_certificate(der).serial_number

    async def get(self, path: str) -> tuple[int, int]:
        """The status of GET ``path`` on this same connection, and the serial it was opened with."""
        return await trio.to_thread.run_sync(self._get, path)

    def close(self) -> None:
        self._conn.close()


def refused_naming(process: RoleProcess, culprit: Path) -> Callable[[], Awaitable[bool]]:
    """Whether ``process`` has logged a refusal naming ``culprit``."""

    async def check() -> bool:
        return any(str(culprit) in e.get("error", "") for e in process.named("certificate_refused"))

    return check


async def test_hub_serves_a_rotated_certificate_to_new_connections_and_keeps_open_ones(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """A broken rotation is refused and A kept; the rotation to B reaches new connections on both listeners,
    while an edge session and an HTTPS connection opened under A go on working."""
    node = unique("rotation")
    tokens = await register_edges(crds, [node])
    a, b = make_pem(tmp_path / "a"), make_pem(tmp_path / "b")
    volume = SecretVolume(tmp_path / "tls")
    volume.write(a.files())
    ws_port, http_port = free_port(), free_port()
    config = {
        "kubeconfig": str(crds.kubeconfig("cloud")),
        "hubId": "hub-rotation",
        "listen": f"{LOOPBACK}:{ws_port}",
        "httpListen": f"{LOOPBACK}:{http_port}",
        "tlsCertFile": str(volume.path(CERT_FILE)),
        "tlsKeyFile": str(volume.path(KEY_FILE)),
        "tlsReloadInterval": RELOAD_INTERVAL,
    }
    client = _client(a, b)
    async with role_process("cloud", config, tmp_path) as hub:
        kept = KeptConnection(http_port, client)

        async def ready() -> bool:
            try:
                return (await kept.get("/readyz"))[0] == 200
            except OSError:
                kept.close()
                return False

        await until(ready, what="the hub ready")
        headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
        url = f"wss://{LOOPBACK}:{ws_port}/nodes/{node}"
        async with trio_websocket.open_websocket_url(url, ssl_context=client, extra_headers=headers) as edge:
            await edge.send_message(messages.encode(Hello(node=node, version="v1.0.0")))
            assert isinstance(messages.decode_downstream(await edge.get_message()), Welcome)

            volume.write({**b.files(), KEY_FILE: a.key})
            await until(refused_naming(hub, volume.path(KEY_FILE)), what="the mismatched pair refused")
            assert [await served_serial(p, client) for p in (ws_port, http_port)] == [a.serial, a.serial]
            assert await kept.get("/healthz") == (200, a.serial)

            volume.write(b.files())

            async def serves_b() -> bool:
                return await served_serial(ws_port, client) == b.serial

            await until(serves_b, what="B served to new edge connections")
            assert await served_serial(http_port, client) == b.serial
            with trio.fail_after(10):
                await edge.ping()
            assert await kept.get("/healthz") == (200, a.serial)
        kept.close()
    (reloaded,) = hub.named("certificate_reloaded")
    assert reloaded["serial"] == f"{b.serial:x}"
    assert len(hub.named("certificate_refused")) == 1


def _registered_ca(crds: ControlPlane) -> bytes:
    try:
        result = crds.kubectl("get", "validatingwebhookconfiguration", "nodetaskd", "-o", "json")
    except ControlPlaneError:
        return b""
    return base64.b64decode(json.loads(result.stdout)["webhooks"][0]["clientConfig"]["caBundle"])


_PROBE = {
    "apiVersion": "operations.kubeedge.io/v1alpha2",
    "kind": "NodeUpgradeJob",
    "metadata": {"name": "probe"},
    "spec": {"version": "latest", "nodeNames": ["a"]},
}
"""A job the schema admits and the validating webhook refuses (``latest`` is no version)."""


async def _probe(crds: ControlPlane) -> str:
    """A dry run of the probe: empty when admitted, otherwise the API server's message."""
    try:
        await kubectl(crds, "create", "--dry-run=server", "-f", "-", input=json.dumps(_PROBE))
    except ControlPlaneError as exc:
        return str(exc) or "refused"
    return ""


async def _webhook_refuses(crds: ControlPlane) -> bool:
    """Whether the validating webhook answered the probe (and refused it)."""
    return "denied the request" in await _probe(crds)


async def test_controller_serves_a_rotated_webhook_certificate_and_registers_its_new_ca(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """A broken rotation is refused and A kept (its CA registered); the rotation to B (a new CA) reaches new
    connections, B's CA is registered, and a connection opened under A goes on working."""
    a, b = make_pem(tmp_path / "a"), make_pem(tmp_path / "b")
    volume = SecretVolume(tmp_path / "tls")
    volume.write(a.files())
    webhook_port, metrics_port = free_port(), free_port()
    config = {
        "kubeconfig": str(crds.kubeconfig("controller")),
        "identity": "rotation-test",
        "leaseName": unique("rotation-lease"),
        "leaseDuration": 3,
        "listenHost": LOOPBACK,
        "webhookPort": webhook_port,
        "webhookUrl": f"https://{LOOPBACK}:{webhook_port}",
        "metricsPort": metrics_port,
        "tlsCertFile": str(volume.path(CERT_FILE)),
        "tlsKeyFile": str(volume.path(KEY_FILE)),
        "tlsCaFile": str(volume.path(CA_FILE)),
        "tlsReloadInterval": RELOAD_INTERVAL,
    }
    client = _client(a, b)
    try:
        async with role_process("controller", config, tmp_path) as controller:

            async def registered(pem: Pem) -> bool:
                return await trio.to_thread.run_sync(_registered_ca, crds) == pem.ca

            await until(lambda: registered(a), what="A's CA registered")
            await until(lambda: _webhook_refuses(crds), what="the webhook in force")
            kept = KeptConnection(webhook_port, client)
            assert await kept.get("/validate") == (405, a.serial)

            volume.write({**b.files(), KEY_FILE: a.key})
            await until(refused_naming(controller, volume.path(KEY_FILE)), what="the mismatched pair refused")
            assert await served_serial(webhook_port, client) == a.serial
            assert await registered(a)
            assert await kept.get("/validate") == (405, a.serial)

            volume.write(b.files())

            async def serves_b() -> bool:
                return await served_serial(webhook_port, client) == b.serial

            await until(serves_b, what="B served to new connections")
            await until(lambda: registered(b), what="B's CA registered")
            await until(lambda: _webhook_refuses(crds), what="the webhook in force with B")
            assert await kept.get("/validate") == (405, a.serial)
            kept.close()
        (reloaded,) = controller.named("certificate_reloaded")
        assert reloaded["serial"] == f"{b.serial:x}"
    finally:
        with anyio.CancelScope(shield=True):
            # The configurations outlive the process on purpose; their policy is Fail and their server
            # is gone: the tests after this one must not meet them.
            await kubectl(
                crds,
                "delete",
                "validatingwebhookconfiguration,mutatingwebhookconfiguration",
                "nodetaskd",
                "--ignore-not-found",
            )

            async def dropped() -> bool:
                return not await _probe(crds)

            await until(dropped, what="the webhook dropped by the API server")
