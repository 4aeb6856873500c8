"""The hub an edge footprint agent talks to (:mod:`bench.edge_footprint`): just enough of one, in the
benchmark process, that nothing else is measured in the agent's."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec
import trio_websocket

from bench.edge_device import NODE
from flows.nodejobs import imageprepulljob
from nodetask import messages
from nodetask.route import Route
from roles.common.tls import generate_serving_certificate, server_ssl_context
from schemas.v1alpha2 import API_VERSION, ImagePrePullJobSpec, ImagePrePullTemplate


@dataclass(slots=True)
class MinimalHub:
    """Just enough of a hub for one agent: welcome, echo heartbeats, dispatch one pull, ack reports."""

    image: str
    cache: tuple[messages.CacheObjects, ...] | None = None
    """With these, the hub lists ``cache.v1``, requests autonomy and sends them after its Welcome."""
    welcomed: anyio.Event = field(default_factory=anyio.Event)
    start_pull: anyio.Event = field(default_factory=anyio.Event)
    pulled: anyio.Event = field(default_factory=anyio.Event)
    autonomous: anyio.Event = field(default_factory=anyio.Event)
    """Set when the agent reports its Autonomy condition True (everything sent is cached)."""
    pull_report: messages.Report | None = None

    async def handle(self, request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._dispatch, ws)
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                while True:
                    msg = messages.decode_upstream(await ws.get_message())
                    await self._answer(ws, msg)
            tg.cancel_scope.cancel()

    async def _answer(self, ws: trio_websocket.WebSocketConnection, msg: messages.Upstream) -> None:
        if isinstance(msg, messages.Hello):
            capabilities = () if self.cache is None else (messages.CACHE_CAPABILITY,)
            welcome = messages.Welcome(hub="bench", heartbeat_interval=15.0, capabilities=capabilities)
            await ws.send_message(messages.encode(welcome))
            if self.cache is not None:
                for frame in (*self.cache, messages.Autonomy(requested=True)):
                    await ws.send_message(messages.encode(frame))
            self.welcomed.set()
        elif isinstance(msg, messages.AutonomyCondition) and msg.status == "True":
            self.autonomous.set()
        elif isinstance(msg, messages.Heartbeat):
            await ws.send_message(messages.encode(msg))
        elif isinstance(msg, messages.Report):
            await ws.send_message(messages.encode(messages.ReportAck(job_uid=msg.job_uid, seq=msg.seq)))
            if msg.action == imageprepulljob.PULL:
                self.pull_report = msg
                self.pulled.set()

    async def _dispatch(self, ws: trio_websocket.WebSocketConnection) -> None:
        await self.start_pull.wait()
        spec = ImagePrePullJobSpec(image_pre_pull_template=ImagePrePullTemplate(images=(self.image,)))
        await ws.send_message(
            messages.encode(
                messages.RunAction(
                    id="bench-pull",
                    route=Route(API_VERSION, imageprepulljob.JOB_TYPE.resource_type, "bench-pull", NODE),
                    job_uid=secrets.token_hex(8),
                    action=imageprepulljob.CHECK,
                    spec=msgspec.Raw(msgspec.json.encode(spec)),
                )
            )
        )


@contextlib.asynccontextmanager
async def serving(hub: MinimalHub, home: Path) -> AsyncIterator[tuple[int, Path]]:
    """``hub`` serving wss:// on loopback with a certificate made in ``home``: its port, and the CA file an
    agent trusts it by."""
    cert = generate_serving_certificate(home / "tls", dns_names=["localhost"])
    ca_file = home / "ca.pem"
    ca_file.write_bytes(cert.ca_bundle)
    async with anyio.create_task_group() as tg:
        server = await tg.start(trio_websocket.serve_websocket, hub.handle, "127.0.0.1", 0, server_ssl_context(cert))
        yield server.port, ca_file
        tg.cancel_scope.cancel()
