"""Running hubs, a controller and light edges in the test process, against the real control plane; an API client
that keeps what it sent."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import structlog
import trio_asyncio
from prometheus_client import CollectorRegistry

from nodetask.clock import Clock
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.metrics import HubMetrics
from roles.common.jobtypes import job_types
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import Kube, crossing, open_kube
from roles.kube.aio import AioApi, log_asyncio_error
from roles.kube.resources import JSON
from schemas.kinds import KINDS
from tests.integration.controlplane import ControlPlane
from tools.doubles.lightedge import Interval, LightEdge


@dataclass(frozen=True, slots=True)
class Sent:
    """One request an API client sent: what it asked for and, but for a watch, the answer's bytes."""

    method: str
    path: str
    query: dict[str, str]
    accept: str
    answer: bytes | None = None
    """None for a watch (a stream)."""


class RecordingApi(AioApi):
    """The real API client, keeping each request it sends (:attr:`sent`)."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.sent: list[Sent] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> bytes:
        answer = await super().request(method, path, **kwargs)
        self.sent.append(Sent(method, path, dict(kwargs.get("query") or {}), kwargs.get("accept", JSON), answer))
        return answer

    async def stream(self, path: str, **kwargs: Any) -> None:
        self.sent.append(Sent("GET", path, dict(kwargs["query"]), kwargs.get("accept", JSON)))
        await super().stream(path, **kwargs)


@asynccontextmanager
async def recording_kube(cp: ControlPlane, identity: str) -> AsyncIterator[tuple[Kube, RecordingApi]]:
    """A client authenticated as ``identity`` (as ``open_kube`` opens one) whose requests the test sees."""
    log = structlog.get_logger()
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(functools.partial(log_asyncio_error, log=log))
        cross = crossing.bound(loop)
        api = await cross(RecordingApi.connect, str(cp.kubeconfig(identity)))
        try:
            yield Kube(api, log=log, cross=cross), api
        finally:
            with anyio.move_on_after(5, shield=True):
                await cross(api.close)


@dataclass(slots=True)
class RunningHub:
    hub: Hub
    url: str
    registry: CollectorRegistry
    scope: anyio.CancelScope


@asynccontextmanager
async def running_hub(
    cp: ControlPlane,
    hub_id: str,
    *,
    port: int = 0,
    window: float = 0.05,
    heartbeat: float = 1.0,
    close_grace: float = 2.0,
    token_namespace: str = "kube-system",
    hub_type: type[Hub] = Hub,
    kube: Kube | None = None,
    **settings_: Any,
) -> AsyncIterator[RunningHub]:
    """A hub authenticated as the cloud role (or using ``kube``), serving plain ws:// on loopback until the block ends.

    ``hub_type`` may be a subclass that injects faults; other keywords are further :class:`HubSettings`.
    """
    registry = CollectorRegistry()
    settings = HubSettings(
        hub_id=hub_id,
        heartbeat_interval=heartbeat,
        coalesce_window=window,
        close_grace=close_grace,
        token_namespace=token_namespace,
        **settings_,
    )
    async with AsyncExitStack() as stack:
        if kube is None:
            kube = await stack.enter_async_context(
                open_kube(kubeconfig=str(cp.kubeconfig("cloud")), log=structlog.get_logger())
            )
        hub_kube = kube
        hub = hub_type(
            kube=kube,
            clock=Clock.start(),
            log=structlog.get_logger(),
            settings=settings,
            job_types=job_types(),
            metrics=HubMetrics(
                registry, sessions=lambda: len(hub.sessions), kube=lambda: (hub_kube.writes, hub_kube.conflicts)
            ),
        )
        async with anyio.create_task_group() as tg:
            bound = await tg.start(partial(hub.run, host="127.0.0.1", port=port, ssl_context=None))
            yield RunningHub(hub=hub, url=f"ws://127.0.0.1:{bound}", registry=registry, scope=tg.cancel_scope)
            tg.cancel_scope.cancel()


@asynccontextmanager
async def running_controller(cp: ControlPlane) -> AsyncIterator[Reconciler]:
    """The controller role's reconciler, authenticated as the controller."""
    async with open_kube(kubeconfig=str(cp.kubeconfig("controller")), log=structlog.get_logger()) as kube:
        reconciler = Reconciler(kube=kube, clock=Clock.start(), log=structlog.get_logger(), kinds=KINDS)
        async with anyio.create_task_group() as tg:
            await tg.start(reconciler.run)
            yield reconciler
            tg.cancel_scope.cancel()


@asynccontextmanager
async def running_edges(edges: Iterable[LightEdge]) -> AsyncIterator[list[LightEdge]]:
    """Light edges, each connected once before the block starts."""
    fleet = list(edges)
    async with anyio.create_task_group() as tg:
        for edge in fleet:
            await tg.start(edge.run)
        yield fleet
        tg.cancel_scope.cancel()


def light_edge(node: str, url: str, token: str, **kwargs: object) -> LightEdge:
    return LightEdge(node=node, url=url, token=token, job_types=job_types(), **kwargs)  # type: ignore[arg-type]


def peak_overlap(intervals: Iterable[Interval]) -> int:
    """The most intervals open at one moment (an interval ending as another starts does not overlap it)."""
    spans = list(intervals)
    marks = sorted([(i.start, 1) for i in spans] + [(i.end, -1) for i in spans])
    peak = current = 0
    for _, step in marks:
        current += step
        peak = max(peak, current)
    return peak


async def eventually(check: Callable[[], object], limit_s: float = 20, interval: float = 0.05) -> None:
    """Wait until ``check()`` is truthy; fail after ``limit_s`` seconds."""
    with anyio.fail_after(limit_s):
        while True:
            if check():
                return
            await anyio.sleep(interval)
