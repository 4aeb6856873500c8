"""Fault injection on the real control plane with every role as a real process.

Each test runs a ConfigUpdateJob (every node rewrites its config and restarts itself, so node tasks
take seconds) over four agents with concurrency 2, injects one fault mid-job, and then checks that
the job completed, that every node reported each action exactly once, that no version of the job
the API server ever held had more than ``concurrency`` nodes InProgress, and that every process
exits cleanly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube, NotFound
from roles.kube.resources import job_resource
from schemas.kinds import CONFIG_UPDATE_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import create_job, job_when, kubectl, settled, unique
from tests.integration.processes import Fleet, JobHistory, fleet, recording

pytestmark = [pytest.mark.integration, pytest.mark.slow(250)]
JOBS = job_resource(CONFIG_UPDATE_JOB)
CONCURRENCY = 2
EXPECTED = [("Check", "True"), ("BackUp", "True"), ("Update", "True")]


def _flow(entry: Any) -> list[tuple[str, str]]:
    return [(a.action, a.status) for a in entry.action_flow]


def _some_done_some_running(job: Any) -> bool:
    phases = [e.phase for e in job.status.node_status]
    return NodeTaskPhase.SUCCESSFUL in phases and NodeTaskPhase.IN_PROGRESS in phases


def _in_flight(job: Any) -> bool:
    # Dispatched is enough: an agent's first reports may only arrive after its restart.
    return any(e.phase is NodeTaskPhase.IN_PROGRESS for e in job.status.node_status)


@asynccontextmanager
async def faulty_job(
    cp: ControlPlane, kube: Kube, home: Path, **fleet_options: Any
) -> AsyncIterator[tuple[Fleet, str, JobHistory]]:
    """A fleet running one ConfigUpdateJob over all its nodes; checks the outcome when the block ends."""
    name = unique("fault")
    async with fleet(cp, home, edges=4, **fleet_options) as running, recording(kube, JOBS, name) as history:
        nodes = list(running.edges)
        spec = {
            "nodeNames": nodes,
            "updateFields": {"logLevel": "debug"},
            "concurrency": CONCURRENCY,
            "timeoutSeconds": 120,
        }
        await create_job(cp, "ConfigUpdateJob", name, spec)
        yield running, name, history
        job = await job_when(kube, JOBS, name, settled, limit_s=90)
        assert job.status.phase is JobPhase.COMPLETED, [
            (e.node_name, e.phase, e.reason) for e in job.status.node_status
        ]
        # A node's last action decides its phase, so the job can complete while an earlier report is
        # still being retried (say, after a 403 from an API server warming up): wait for every report.
        with anyio.move_on_after(30):
            job = await job_when(kube, JOBS, name, lambda j: all(_flow(e) == EXPECTED for e in j.status.node_status))
    for entry in job.status.node_status:
        assert _flow(entry) == EXPECTED, entry.node_name
    assert history.versions, "the watch saw no version of the job"
    assert history.peak_in_progress() <= CONCURRENCY
    assert all(code == 0 for p, code in running.exits.items() if not running.named(p).killed), running.exits
    assert not any(p.alive for p in running.all())


async def test_a_hub_killed_mid_job_leaves_its_edges_to_the_other_hub(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """SIGKILL of one hub: its edges fail over to the other hub, which adopts their node tasks."""
    async with faulty_job(crds, cloud_kube, tmp_path) as (running, name, _):
        await job_when(cloud_kube, JOBS, name, _in_flight)
        await running.hubs[0].kill()


async def test_a_controller_restarted_mid_job_takes_the_lease_back_and_finishes(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """SIGKILL of the controller, then a new one: it waits out the lease and carries the job on."""
    async with faulty_job(crds, cloud_kube, tmp_path) as (running, name, _):
        await job_when(cloud_kube, JOBS, name, _some_done_some_running)
        await running.controller.kill()
        await running.controller.start()


async def test_an_apiserver_restart_mid_job_is_survived_by_every_role(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """kube-apiserver stops and starts again; watches resume and writes retry until it is back."""
    async with faulty_job(crds, cloud_kube, tmp_path) as (_, name, _):
        await job_when(cloud_kube, JOBS, name, _in_flight)
        await anyio.to_thread.run_sync(crds.restart_apiserver)


async def test_an_edge_killed_mid_flow_resumes_from_its_store(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """SIGKILL of an agent in the middle of its config update, then a restart: it finishes exactly once."""
    async with faulty_job(crds, cloud_kube, tmp_path) as (running, name, _):
        job = await job_when(cloud_kube, JOBS, name, _in_flight)
        victim = next(e.node_name for e in job.status.node_status if e.phase is NodeTaskPhase.IN_PROGRESS)
        await running.edges[victim].kill()
        await anyio.sleep(1.5)
        await running.edges[victim].start()


async def test_a_job_deleted_mid_flight_and_recreated_under_its_name_runs_afresh(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """Deleting the job while nodes run stops it; the same name created again completes on its own."""
    async with faulty_job(crds, cloud_kube, tmp_path) as (running, name, _):
        first = await job_when(cloud_kube, JOBS, name, _in_flight)
        # kubectl would block this task while the controller (another process) removes the finalizer.
        await kubectl(crds, "delete", "configupdatejob", name, "--wait=false")
        with anyio.fail_after(30):
            while True:
                try:
                    await cloud_kube.get(JOBS, name)
                except NotFound:
                    break
                await anyio.sleep(0.2)
        # An agent that was restarting onto its new config when the job went still finishes that
        # update and holds the node's exclusive slot until then; a new update arriving meanwhile is
        # refused by design. Give those a moment, as an operator re-creating a job would.
        await anyio.sleep(5)
        spec = msgspec.to_builtins(first.spec)
        await create_job(crds, "ConfigUpdateJob", name, spec)
        again = await job_when(cloud_kube, JOBS, name, lambda j: bool(j.metadata.uid))
        assert again.metadata.uid != first.metadata.uid
        assert list(running.edges) == [e.node_name for e in first.status.node_status]


class Blackhole:
    """A TCP relay that can stop moving bytes without closing anything, as a dead network link does."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.flowing = anyio.Event()
        self.flowing.set()

    def cut(self) -> None:
        self.flowing = anyio.Event()

    def restore(self) -> None:
        self.flowing.set()

    async def _pump(self, source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream) -> None:
        # Either side may vanish at any moment (that is the point): a broken pipe ends the relay.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            async for data in source:
                await self.flowing.wait()
                await sink.send(data)
            await sink.send_eof()

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(OSError):
            async with (
                client,
                await anyio.connect_tcp("127.0.0.1", self.upstream) as server,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(self._pump, client, server)
                await self._pump(server, client)
                tg.cancel_scope.cancel()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        await listener.serve(self._relay)


async def test_an_edge_cut_off_longer_than_a_heartbeat_reconnects_and_finishes(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """One edge's link goes silent for 5 s (heartbeats every 1 s): both ends drop it, it comes back."""
    # The relay learns its upstream (the first hub's port) once the fleet exists; until then the
    # edge's connection attempts fail and it retries, as against a hub that is not up yet.
    relay = Blackhole(0)
    async with anyio.create_task_group() as tg:
        relay_port = await tg.start(relay.serve)

        def through_relay(urls: list[str], index: int) -> list[str]:
            return [f"ws://127.0.0.1:{relay_port}"] if index == 0 else urls

        async with faulty_job(crds, cloud_kube, tmp_path, hub_urls=through_relay) as (running, name, _):
            relay.upstream = int(running.hub_urls[0].rsplit(":", 1)[1])
            cut_off = next(iter(running.edges))
            await job_when(cloud_kube, JOBS, name, lambda j: bool(j.status.node_status))
            relay.cut()
            await anyio.sleep(5)
            relay.restore()
            await job_when(
                cloud_kube,
                JOBS,
                name,
                lambda j: any(e.node_name == cut_off and e.phase.terminal for e in j.status.node_status),
            )
        tg.cancel_scope.cancel()
