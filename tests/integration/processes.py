"""The three roles as real processes for fault-injection tests, each with its own config and log file."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from nodetask.phases import NodeTaskPhase
from roles.kube import Kube, Upserted, WatchEvent
from roles.kube.resources import Resource
from tests.integration.agents import write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.objects import unique
from tools.ports import free_ports
from tools.processes import NotReady, role_command, terminate, until_ports, until_ready

READY_LIMIT_S = 180.0
"""How long a role may take to serve: Python's start-up alone takes tens of seconds on a loaded machine."""


@dataclass(slots=True)
class RoleProcess:
    """One ``nodetaskd`` process; it can be killed, stopped and started again with the same config."""

    name: str
    config: Path
    role: str
    log: Path
    ready_url: str = ""
    """Answers 200 once the process serves (its /readyz), if it has one."""
    env: dict[str, str] = field(default_factory=dict)
    """Set in its environment beside this process's own."""
    process: anyio.abc.Process | None = None
    starts: int = 0
    killed: bool = False
    """Killed and not started again: its last exit status is SIGKILL's, by design."""

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = await anyio.open_process(
                role_command(self.role, self.config),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env else None,
            )
        self.starts += 1
        self.killed = False

    async def kill(self) -> None:
        """SIGKILL: no clean-up at all, as a crash or an OOM kill."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()
            self.killed = True

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 15 s; the exit status (None if it had to be killed)."""
        if self.process is None:
            return None
        code = await terminate(self.process)
        if code is None:
            self.killed = True
        return code

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def until_ready(self, limit_s: float = READY_LIMIT_S) -> None:
        """Wait until :attr:`ready_url` answers 200; fails naming the process (and its log's tail) if it exits
        or is still not ready after ``limit_s``."""
        if not self.ready_url:
            return
        assert self.process is not None, f"{self.name} was not started"
        try:
            await until_ready(self.process, self.ready_url, limit_s=limit_s)
        except NotReady as exc:
            tail = self.log.read_bytes()[-3000:].decode(errors="replace") if self.log.exists() else ""
            raise AssertionError(f"{self.name} {exc}; its log ends:\n{tail}") from None

    async def reported_ports(self, ports_file: Path, *, limit_s: float = READY_LIMIT_S) -> dict[str, int]:
        """The ports this hub, started on port 0, wrote to its ``portsFile`` (``listen``, ``httpListen``)."""
        assert self.process is not None, f"{self.name} was not started"
        try:
            return await until_ports(self.process, ports_file, limit_s=limit_s)
        except NotReady as exc:
            raise AssertionError(f"{self.name} {exc}: {self.log.read_text()[-2000:]}") from None


@dataclass(slots=True)
class Fleet:
    """A controller, hubs and edge agents as processes, with the nodes they serve."""

    controller: RoleProcess
    hubs: list[RoleProcess]
    hub_urls: list[str]
    edges: dict[str, RoleProcess]
    exits: dict[str, int | None] = field(default_factory=dict)

    def all(self) -> list[RoleProcess]:
        return [self.controller, *self.hubs, *self.edges.values()]

    def named(self, name: str) -> RoleProcess:
        return next(p for p in self.all() if p.name == name)


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_bytes(msgspec.yaml.encode(config))
    return path


@asynccontextmanager
async def fleet(
    cp: ControlPlane,
    home: Path,
    *,
    edges: int,
    hubs: int = 2,
    hub_options: dict[str, object] | None = None,
    hub_urls: Callable[[list[str], int], list[str]] | None = None,
    edge_options: Callable[[int], dict[str, object]] | None = None,
) -> AsyncIterator[Fleet]:
    """Start one controller, ``hubs`` hubs (``hub_options`` in their configs) and ``edges`` agents; stop them all
    (and check) at the end.

    Edge ``i`` lists hub ``i % hubs`` first and the others after it, so it fails over when its
    hub goes; ``hub_urls(urls, i)`` may choose differently (e.g. through a proxy). Its config has
    ``edge_options(i)`` too (camelCase keys), when given.
    """
    nodes = [unique("fault") for _ in range(edges)]
    tokens = await register_edges(cp, nodes)
    # Picked, not learned from a port 0: a hub stopped and started again comes back where its edges look.
    ports = iter(free_ports(1 + 2 * hubs))
    metrics_port = next(ports)
    controller = RoleProcess(
        "controller",
        _write(
            home / "controller.yaml",
            {
                "kubeconfig": str(cp.kubeconfig("controller")),
                "identity": unique("controller"),
                "leaseName": unique("fault-lease"),
                # Short, so that a killed controller's successor takes over soon; long enough that a
                # loaded machine's slow answers (seconds, with several test processes) do not lose it.
                "leaseDuration": 8,
                "listenHost": "127.0.0.1",
                "webhookPort": 0,
                "metricsPort": metrics_port,
            },
        ),
        "controller",
        home / "controller.log",
        ready_url=f"http://127.0.0.1:{metrics_port}/readyz",
    )
    hub_processes, urls = [], []
    for i in range(hubs):
        port, http_port = next(ports), next(ports)
        urls.append(f"ws://127.0.0.1:{port}")
        config = {
            "kubeconfig": str(cp.kubeconfig("cloud")),
            "hubId": f"hub-{i}",
            "listen": f"127.0.0.1:{port}",
            "httpListen": f"127.0.0.1:{http_port}",
            "heartbeatInterval": 1,
            "statusCoalesceWindow": 0.1,
            **(hub_options or {}),
        }
        config_file = _write(home / f"hub-{i}.yaml", config)
        ready = "" if "tlsCertFile" in config else f"http://127.0.0.1:{http_port}/readyz"
        hub_processes.append(RoleProcess(f"hub-{i}", config_file, "cloud", home / f"hub-{i}.log", ready_url=ready))
    agents: dict[str, RoleProcess] = {}
    for i, node in enumerate(nodes):
        ordered = hub_urls(urls, i) if hub_urls else urls[i % hubs :] + urls[: i % hubs]
        options: dict[str, object] = {"configUpdateHealthDeadline": 20, **(edge_options(i) if edge_options else {})}
        edge_config = write_agent_config(home / node, node=node, token=tokens[node], hub_urls=ordered, **options)
        agents[node] = RoleProcess(node, edge_config, "edge", home / node / "agent.log")
    running = Fleet(controller=controller, hubs=hub_processes, hub_urls=urls, edges=agents)
    try:
        # The cloud first, then the devices, as a cluster comes up: each test's clock starts with every
        # role serving, however long a loaded machine takes to start them (agents would otherwise spend
        # that time backing off, up to half a minute between tries).
        for process in (controller, *hub_processes):
            await process.start()
        for process in (controller, *hub_processes):
            await process.until_ready()
        for process in agents.values():
            await process.start()
        yield running
    finally:
        with anyio.CancelScope(shield=True):
            for process in running.all():
                running.exits[process.name] = await process.stop()


@dataclass(slots=True)
class JobHistory:
    """Every version of one job the watch delivered: the evidence for "concurrency was never exceeded"."""

    versions: list[Any] = field(default_factory=list)

    def peak_in_progress(self) -> int:
        return max(
            (sum(e.phase is NodeTaskPhase.IN_PROGRESS for e in job.status.node_status) for job in self.versions),
            default=0,
        )


@asynccontextmanager
async def recording(kube: Kube, resource: Resource[Any], name: str) -> AsyncIterator[JobHistory]:
    """Record every version of job ``name`` while the block runs."""
    history = JobHistory()
    send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=float("inf"))

    async def collect() -> None:
        async with receive:
            async for event in receive:
                if isinstance(event, Upserted) and event.obj.metadata.name == name:
                    history.versions.append(event.obj)

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        await tg.start(kube.watch, resource, send)
        yield history
        tg.cancel_scope.cancel()
