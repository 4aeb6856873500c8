"""Doubles for the transport room's unit tests: the token Secrets an API server serves, and a socket
that answers as OpenSSL does mid-handshake."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import anyio
import anyio.abc
import trio.testing

from roles.cloud.transport.auth import token_secret
from roles.kube import ApiError, NotFound, WatchEvent
from schemas.core import Secret

NAMESPACE = "kube-system"


class FakeSecrets:
    """Secrets by name for GETs, and the token watch's stream for the test to feed."""

    def __init__(self) -> None:
        self.secrets: dict[str, Secret] = {}
        self.reads = 0
        self.gate: anyio.Event | None = None
        """When set, a GET's answer waits for it: a read in flight while the watch moves on."""
        self.events: anyio.abc.ObjectSendStream[WatchEvent] | None = None
        self.unavailable = False
        """When set, a GET fails as an API server that does not answer would."""

    def put(self, node: str, token: str) -> Secret:
        secret = token_secret(node, token, namespace=NAMESPACE)
        self.secrets[secret.metadata.name] = secret
        return secret

    async def get(self, _resource: Any, name: str, *, namespace: str = "") -> Secret:
        self.reads += 1
        if self.unavailable:
            raise ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        answer = self.secrets.get(name)  # what the API server said, even if it reaches the hub late
        if self.gate is not None:
            await self.gate.wait()
        if answer is None:
            raise NotFound(404, "NotFound", f"secrets {name!r} not found")
        return answer

    async def watch(self, _resource: Any, send: anyio.abc.ObjectSendStream[WatchEvent], **_: Any) -> None:
        self.events = send
        await anyio.sleep_forever()

    async def say(self, event: WatchEvent) -> None:
        """Deliver a watch event and let the book take it in."""
        assert self.events is not None
        await self.events.send(event)
        await trio.testing.wait_all_tasks_blocked()


class WantingSocket(socket.socket):
    """A socket whose next reads or writes first answer as OpenSSL does mid-handshake (renegotiation)."""

    def __init__(self, fileno: int) -> None:
        super().__init__(fileno=fileno)
        self.on_recv: list[type[ssl.SSLError]] = []
        self.on_send: list[type[ssl.SSLError]] = []

    def recv(self, size: int, flags: int = 0) -> bytes:
        if self.on_recv:
            raise self.on_recv.pop(0)()
        return super().recv(size, flags)

    def send(self, data: object, flags: int = 0) -> int:
        if self.on_send:
            raise self.on_send.pop(0)()
        return super().send(data, flags)  # type: ignore[arg-type]
