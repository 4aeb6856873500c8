"""The edge agent's test doubles: a fake hub over in-memory links, fake actions, and an agent running against them.

The fake hub answers each Hello with a Welcome, echoes heartbeats (unless told to stay silent) and
hands every other frame to the test, which plays the hub's part. :func:`running_edge` runs a real
agent with its real store on disk against them, in virtual time (the ``clock`` fixture of this
folder's conftest), with a ticker that keeps the next deadline at most a second away: a slow disk
costs virtual seconds, never the test's guard.
"""

from __future__ import annotations

import itertools
import math
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from flows.diagnosis import hub_task as diagnosis_dispatch
from flows.diagnosis import job as diagnosis_job
from flows.nodejobs import imageprepulljob
from nodetask import messages
from nodetask.clock import Clock
from nodetask.link import Link, LinkClosed, MemoryLink, memory_links
from nodetask.messages import (
    Heartbeat,
    Hello,
    Report,
    RunAction,
    Upstream,
    Welcome,
)
from nodetask.registry_credentials import RegistryAuth
from nodetask.route import Route
from roles.common.config import DiagnosisConfig
from roles.common.jobtypes import edge_job_types
from roles.edge.actions import diagnosis_run
from roles.edge.agent import EdgeAgent
from roles.edge.checks.checks import Thresholds
from roles.edge.context import Action, Outcome, TaskContext
from roles.edge.node_api.certificate_keeper import CertificateKeeper
from roles.edge.processors import ProcessorEnv, ProcessorOutcome
from roles.edge.settings import AgentSettings
from roles.edge.store.store import EdgeStore, open_store
from schemas.diagnosis.v1 import Task, TaskSpec
from schemas.meta import ObjectMeta
from schemas.processors import HTTPServer, Processor
from schemas.v1alpha2 import API_VERSION, ImagePrePullJobSpec, ImagePrePullTemplate

NODE: Final = "edge-1"
PREPULL: Final = imageprepulljob.JOB_TYPE.resource_type
INTERVAL: Final = 1.0
"""The fake hub's heartbeat interval, and the ticker's."""
GUARD: Final = 1000.0
"""Virtual seconds a test may take (each tick of an idle second costs 5 ms of real time)."""
IMAGE: Final = "registry.example/app:1"
AUTH: Final = RegistryAuth("registry.example", "puller", "s3cret")
OLD_FORM: Final = '{"registry": "registry.example", "username": "puller", "password": "s3cret"}'
""":data:`AUTH` as hubs built before the typed field (``RunAction.registry_credentials``) send it."""
SPEC: Final = msgspec.Raw(
    msgspec.json.encode(ImagePrePullJobSpec(image_pre_pull_template=ImagePrePullTemplate(images=("busybox",))))
)
PROCESSOR: Final = Processor(http_server=HTTPServer(address="127.0.0.1", port=9, path="/check"), timeout_seconds=5)


def run_action(job: str, *, action: str = imageprepulljob.CHECK, attempt: int = 0) -> RunAction:
    return RunAction(
        id=f"run-{job}" + (f"-{attempt}" if attempt else ""),
        route=Route(API_VERSION, PREPULL, job, NODE),
        job_uid=f"uid-{job}",
        action=action,
        spec=SPEC,
        attempt=attempt,
    )


def task_action(
    name: str, *, parameters: Mapping[str, str] | None = None, processor: Processor = PROCESSOR
) -> RunAction:
    """The RunAction a hub sends for the diagnosis Task ``name`` (uid ``uid-<name>``) on this node."""
    task = Task(
        metadata=ObjectMeta(name=name, namespace="ns", uid=f"uid-{name}"),
        spec=TaskSpec(operation="check", node_name=NODE, parameters=dict(parameters or {"target": "10.0.0.1"})),
    )
    return RunAction(
        id=f"run-{name}",
        route=diagnosis_dispatch.route_of(task),
        job_uid=task.metadata.uid,
        action=diagnosis_job.RUN,
        spec=msgspec.Raw(diagnosis_dispatch.task_run(task, processor)),
    )


@dataclass(eq=False)
class HubSession:
    """The hub's end of one session: what the agent sent besides heartbeats, and a way to answer."""

    link: MemoryLink
    frames: MemoryObjectReceiveStream[Upstream]
    welcomed_at: float
    heartbeats: list[float] = field(default_factory=list)
    """Loop times the agent's heartbeats arrived."""
    ended_at: float | None = None
    """Loop time the agent closed the link."""
    beat: anyio.Event = field(default_factory=anyio.Event)
    """Set (and replaced) whenever a heartbeat arrives."""

    async def wait_heartbeats(self, count: int) -> list[float]:
        """The arrival times of the first ``count`` heartbeats, once they have all arrived."""
        while len(self.heartbeats) < count:
            await self.beat.wait()
        return self.heartbeats[:count]

    async def send(self, msg: messages.Message) -> None:
        await self.link.send(messages.encode(msg))

    async def receive(self) -> Upstream:
        return await self.frames.receive()

    async def reports(self, count: int) -> list[Report]:
        """The next ``count`` frames, each of which must be a report."""
        got = [await self.receive() for _ in range(count)]
        assert all(isinstance(r, Report) for r in got), got
        return [r for r in got if isinstance(r, Report)]

    def nothing_received(self) -> bool:
        try:
            self.frames.receive_nowait()
        except anyio.WouldBlock:
            return True
        return False


@dataclass(eq=False)
class FakeHub:
    """Accepts the agent's links (or refuses the next ``refuse`` of them) and serves each in a task of its own."""

    tg: anyio.abc.TaskGroup
    echo: bool = True
    interval: float = INTERVAL
    refuse: int = 0
    capabilities: tuple[str, ...] = ()
    """What the Welcome lists."""
    reads: bool = True
    """Whether each session's link is read (and so its pings answered) after the Welcome."""
    attempts: list[float] = field(default_factory=list)
    """Loop times the agent tried to connect."""
    hellos: list[Hello] = field(default_factory=list)
    """The agent's Hello of each session, in order."""
    _accepted: tuple[MemoryObjectSendStream[MemoryLink], MemoryObjectReceiveStream[MemoryLink]] = field(
        default_factory=lambda: anyio.create_memory_object_stream[MemoryLink](math.inf)
    )

    @asynccontextmanager
    async def open_link(
        self, url: str, *, headers: Sequence[tuple[bytes, bytes]], ssl_context: ssl.SSLContext | None
    ) -> AsyncIterator[Link]:
        self.attempts.append(anyio.current_time())
        if self.refuse:
            self.refuse -= 1
            raise OSError("connection refused")
        # Unbounded: the hub's echoes never wait for the agent (which may be busy in its store), so the
        # test exercises the agent's logic, not flow control between two fakes.
        agent_end, hub_end = memory_links(math.inf)
        self._accepted[0].send_nowait(hub_end)
        try:
            yield agent_end
        finally:
            await agent_end.close()

    async def accept(self) -> HubSession:
        """The agent's next session, welcomed."""
        link = await self._accepted[1].receive()
        hello = messages.decode_upstream(await link.receive())
        assert isinstance(hello, Hello)
        assert hello.node == NODE
        self.hellos.append(hello)
        welcome = Welcome(hub="fake", heartbeat_interval=self.interval, capabilities=self.capabilities)
        await link.send(messages.encode(welcome))
        frames, received = anyio.create_memory_object_stream[Upstream](math.inf)
        session = HubSession(link, received, welcomed_at=anyio.current_time())
        if self.reads:
            self.tg.start_soon(self._serve, session, frames)
        return session

    async def _serve(self, session: HubSession, frames: MemoryObjectSendStream[Upstream]) -> None:
        with frames:
            try:
                while True:
                    msg = messages.decode_upstream(await session.link.receive())
                    if isinstance(msg, Heartbeat):
                        session.heartbeats.append(anyio.current_time())
                        session.beat.set()
                        session.beat = anyio.Event()
                        if self.echo:
                            await session.link.send(messages.encode(msg))
                    else:
                        frames.send_nowait(msg)
            except LinkClosed:
                session.ended_at = anyio.current_time()


@dataclass(eq=False)
class FakeActions:
    """The pre-pull's Check and Pull, recording their runs; with ``block_pull``, Pull runs until cancelled."""

    runs: list[tuple[str, str]] = field(default_factory=list)
    block_pull: bool = False
    pull_started: anyio.Event = field(default_factory=anyio.Event)
    pull_cancelled: bool = False
    processed: list[tuple[Processor, Mapping[str, str]]] = field(default_factory=list)
    """What the diagnosis processor was asked to run, in order."""
    processor_outcome: ProcessorOutcome = field(default_factory=lambda: ProcessorOutcome(True, {"open": "yes"}))
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    """The device's diagnosis config, as processors see it."""

    async def process(self, processor: Processor, request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
        self.processed.append((processor, request))
        return self.processor_outcome

    def table(self) -> dict[tuple[str, str], Action]:
        async def check(ctx: TaskContext) -> Outcome:
            self.runs.append((ctx.task.job_uid, imageprepulljob.CHECK))
            return Outcome(True)

        async def pull(ctx: TaskContext) -> Outcome:
            self.runs.append((ctx.task.job_uid, imageprepulljob.PULL))
            self.pull_started.set()
            if self.block_pull:
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    self.pull_cancelled = True
                    raise
            return Outcome(True)

        async def no_status() -> Mapping[str, str]:
            return {}

        env = ProcessorEnv(node=NODE, config=self.diagnosis, cri_endpoint="", agent_status=no_status)
        return {
            (PREPULL, imageprepulljob.CHECK): check,
            (PREPULL, imageprepulljob.PULL): pull,
            (diagnosis_job.RESOURCE_TYPE, diagnosis_job.RUN): diagnosis_run(env, self.process),
        }


@dataclass(eq=False)
class Edge:
    agent: EdgeAgent
    store: EdgeStore
    hub: FakeHub
    actions: FakeActions


@asynccontextmanager
async def running_edge(
    tmp_path: Path,
    *,
    echo: bool = True,
    block_pull: bool = False,
    capabilities: tuple[str, ...] = (),
    cache_secrets: bool = False,
    store_max_bytes: int | None = None,
    relisted: Callable[[], object] | None = None,
    refuse: int = 0,
    task_retention: float = 7 * 24 * 3600.0,
    store_quota_bytes: int = 64 << 20,
    max_request_bytes: int = 128 << 10,
    max_concurrent_tasks: int = 4,
    reconnect_cap: float = 30.0,
    actions: FakeActions | None = None,
    certificates: CertificateKeeper | None = None,
) -> AsyncIterator[Edge]:
    """An agent with its store in ``tmp_path``, connected to a fake hub (whose Welcome lists ``capabilities``),
    under a guard of :data:`GUARD` seconds; its actions are ``actions`` (default: :class:`FakeActions`)."""
    settings = AgentSettings(
        node=NODE,
        version="v0.1.0",
        hub_urls=("ws://hub.test",),
        token="t0ken",
        data_dir=tmp_path,
        thresholds=Thresholds(),
        cache_secrets=cache_secrets,
        task_retention=task_retention,
        store_quota_bytes=store_quota_bytes,
        max_request_bytes=max_request_bytes,
        max_concurrent_tasks=max_concurrent_tasks,
        reconnect_cap=reconnect_cap,
    )
    actions = actions or FakeActions(block_pull=block_pull)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_tick)
        with anyio.fail_after(GUARD):
            clock = Clock.start()  # the store's times and the agent's: one clock, as the edge role has it
            async with open_store(tmp_path / "store.sqlite", now=clock.now, max_bytes=store_max_bytes) as store:
                hub = FakeHub(tg, echo=echo, capabilities=capabilities, refuse=refuse)
                agent = EdgeAgent(
                    settings=settings,
                    store=store,
                    actions=actions.table(),
                    job_types=edge_job_types(),
                    clock=clock,
                    log=structlog.get_logger(),
                    open_link=hub.open_link,
                    relisted=relisted,
                    certificates=certificates,
                )
                async with anyio.create_task_group() as agent_tg:
                    await agent_tg.start(agent.run)
                    yield Edge(agent, store, hub, actions)
                    agent_tg.cancel_scope.cancel()
        tg.cancel_scope.cancel()


async def _tick() -> None:
    for _ in itertools.count():
        await anyio.sleep(INTERVAL)


def summary(reports: list[Report]) -> list[tuple[int, str, str, bool]]:
    return [(r.seq, r.job_uid, r.action, r.succ) for r in reports]
