"""The edge agent against a real hub and controller: durable outbox, outages, restarts, failed checks."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
from pathlib import Path

import anyio
import pytest

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.edge.actions import AuthFor
from roles.edge.role import STORE_FILE
from roles.edge.store.records import TaskState
from roles.edge.store.store import open_store
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.v1alpha2 import ImageStatus
from tests.integration.agents import FakeRuntime, agent_command, running_agent, write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import eventually, running_controller, running_hub
from tests.integration.objects import create_job, job_when, unique
from tools.ports import free_port

pytestmark = pytest.mark.integration
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)


def _prepull(nodes: list[str], *, check_items: tuple[str, ...] = (), concurrency: int = 2) -> dict[str, object]:
    template = {
        "nodeNames": nodes,
        "concurrency": concurrency,
        "timeoutSeconds": 120,
        "checkItems": list(check_items),
        "images": ["registry.local/app:1"],
    }
    return {"imagePrePullTemplate": template}


async def test_agents_finish_a_prepull_and_a_failed_check_is_reported_with_kubeedges_text(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """Agents walk Check -> Pull; an unsupported check item fails the node with KubeEdge's reason."""
    nodes = [unique("agent") for _ in range(3)]
    tokens = await register_edges(crds, nodes)
    good, bad = unique("pull"), unique("gpu")
    runtime = FakeRuntime()
    async with running_controller(crds), running_hub(crds, "hub-agents") as hub, contextlib.AsyncExitStack() as stack:
        for node in nodes:
            await stack.enter_async_context(running_agent(node, tokens[node], hub.url, tmp_path / node, runtime))
        await create_job(crds, "ImagePrePullJob", good, _prepull(nodes, check_items=("cpu", "mem", "disk")))
        await create_job(crds, "ImagePrePullJob", bad, _prepull(nodes[:1], check_items=("gpu",)))
        done = await job_when(cloud_kube, PREPULLS, good, lambda j: j.status.phase is JobPhase.COMPLETED)
        failed = await job_when(cloud_kube, PREPULLS, bad, lambda j: j.status.phase is JobPhase.FAILURE)
    assert runtime.pulls == 3
    for entry in done.status.node_status:
        assert [(a.action, a.status) for a in entry.action_flow] == [("Check", "True"), ("Pull", "True")]
        assert [(i.image, i.status) for i in entry.image_status] == [("registry.local/app:1", "True")]
    entry = failed.status.node_status[0]
    assert (entry.phase, entry.reason) == (NodeTaskPhase.FAILURE, "check item gpu not support")


async def test_reports_made_during_an_outage_all_arrive_once_after_it(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """With the hub gone mid-task, results queue in the store and are written exactly once on return."""
    node = unique("outage")
    tokens = await register_edges(crds, [node])
    name = unique("outage")
    port = free_port()
    runtime = FakeRuntime(delay=2.0)
    async with (
        running_controller(crds),
        running_agent(node, tokens[node], f"ws://127.0.0.1:{port}", tmp_path, runtime) as agent,
    ):
        async with running_hub(crds, "hub-outage", port=port):
            await create_job(crds, "ImagePrePullJob", name, _prepull([node]))
            await eventually(lambda: runtime.pulls == 1)
        # The hub is down while the pull finishes; the Pull report waits in the outbox.
        await eventually(lambda: agent.connects == 1 and not agent.connected.is_set())
        await eventually(lambda: runtime.finished == 1)
        async with running_hub(crds, "hub-outage", port=port):
            job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert [a.action for a in job.status.node_status[0].action_flow] == ["Check", "Pull"]
    assert runtime.pulls == 1


async def test_agent_killed_mid_action_resumes_at_that_action_after_restart(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """An agent stopped during Pull resumes at Pull from its store, never re-running Check."""
    node = unique("resume")
    tokens = await register_edges(crds, [node])
    name = unique("resume")
    slow, fast = FakeRuntime(delay=60.0), FakeRuntime()
    async with running_controller(crds), running_hub(crds, "hub-resume") as hub:
        async with running_agent(node, tokens[node], hub.url, tmp_path, slow):
            await create_job(crds, "ImagePrePullJob", name, _prepull([node], check_items=("disk",)))
            await eventually(lambda: slow.pulls == 1)
        async with running_agent(node, tokens[node], hub.url, tmp_path, fast):
            job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert fast.pulls == 1
    assert [(a.action, a.status) for a in job.status.node_status[0].action_flow] == [
        ("Check", "True"),
        ("Pull", "True"),
    ]


async def test_killed_agent_process_delivers_its_results_after_restart(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """Results recorded while the hub was away survive a SIGKILL of the agent and arrive after its restart."""
    node = unique("kill")
    tokens = await register_edges(crds, [node])
    name = unique("kill")
    port = free_port()
    command = agent_command(
        write_agent_config(tmp_path, node=node, token=tokens[node], hub_urls=[f"ws://127.0.0.1:{port}"])
    )
    async with running_controller(crds):
        first = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            async with running_hub(crds, "hub-kill", port=port) as hub:
                await eventually(lambda: node in hub.hub.sessions)
                # The hub stops as soon as the task is dispatched: the results can only be stored, not sent.
                await create_job(crds, "ImagePrePullJob", name, _prepull([node], check_items=("cpu",)))
                await eventually(lambda: any(r.dispatched for r in hub.hub.runners() if r.name == name))
            await eventually(lambda: _finished_tasks(tmp_path / "data" / STORE_FILE) == 1)
            first.send_signal(signal.SIGKILL)
            await first.wait()
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()
        unreported = await cloud_kube.get(PREPULLS, name)
        second = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            async with running_hub(crds, "hub-kill", port=port):
                job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.FAILURE)
            second.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                code = await second.wait()
        finally:
            if second.returncode is None:
                second.kill()
                await second.wait()
    assert [a.action for a in unreported.status.node_status[0].action_flow] in ([], ["Check"])
    entry = job.status.node_status[0]
    assert [(a.action, a.status) for a in entry.action_flow] == [("Check", "True"), ("Pull", "False")]
    assert entry.reason == "a container runtime is not available in nodetaskd v0.1.0 on this node"
    assert code == 0


async def test_a_full_store_is_reported_upstream_with_its_reason_and_loses_nothing_stored(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """When the store cannot take a task (disk full), the hub hears why, and the store still opens."""
    node = unique("full")
    tokens = await register_edges(crds, [node])
    name = unique("full")
    async with open_store(tmp_path / "store.sqlite"):
        pass  # the schema, and nothing more: the cap below leaves no room for a task
    full = (tmp_path / "store.sqlite").stat().st_size
    images = [f"registry.local/team-{i:03d}/an-image-with-a-long-name:{'v' * 40}" for i in range(100)]
    spec: dict[str, object] = {"imagePrePullTemplate": {"nodeNames": [node], "images": images, "concurrency": 1}}
    async with (
        running_controller(crds),
        running_hub(crds, "hub-full") as hub,
        running_agent(node, tokens[node], hub.url, tmp_path, FakeRuntime(), store_max_bytes=full),
    ):
        await create_job(crds, "ImagePrePullJob", name, spec)
        job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.FAILURE)
    entry = job.status.node_status[0]
    assert entry.phase is NodeTaskPhase.FAILURE
    assert entry.reason.startswith("the edge cannot store the task: edge store")
    assert "is full" in entry.reason
    async with open_store(tmp_path / "store.sqlite") as store:
        assert await store.tasks() == ()


class FaultyRuntime(FakeRuntime):
    """A runtime client with a bug: every pull raises what no action expects."""

    async def pull(self, images: tuple[str, ...], retry_times: int, auth_for: AuthFor) -> tuple[ImageStatus, ...]:
        self.pulls += 1
        raise KeyError("imageRef")


async def test_an_action_that_raises_fails_its_task_and_the_agent_keeps_serving(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """An unexpected exception in an action is that task's failure, not the agent's end (nor a crash loop)."""
    node = unique("raises")
    tokens = await register_edges(crds, [node])
    first, second = unique("raises"), unique("raises")
    runtime = FaultyRuntime()
    async with (
        running_controller(crds),
        running_hub(crds, "hub-raises") as hub,
        running_agent(node, tokens[node], hub.url, tmp_path, runtime) as agent,
    ):
        await create_job(crds, "ImagePrePullJob", first, _prepull([node]))
        failed = await job_when(cloud_kube, PREPULLS, first, lambda j: j.status.phase is JobPhase.FAILURE)
        await create_job(crds, "ImagePrePullJob", second, _prepull([node]))
        await job_when(cloud_kube, PREPULLS, second, lambda j: j.status.phase is JobPhase.FAILURE)
        assert agent.connected.is_set()
        assert agent.connects == 1
    entry = failed.status.node_status[0]
    assert [(a.action, a.status) for a in entry.action_flow] == [("Check", "True"), ("Pull", "False")]
    assert entry.action_flow[1].reason == "action Pull raised KeyError: 'imageRef'"
    assert runtime.pulls == 2


def _finished_tasks(store: Path) -> int:
    """How many node tasks an agent's store records as finished (read-only, beside the running agent)."""
    if not store.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        query = "SELECT COUNT(*) FROM node_tasks WHERE state = ?"
        return int(conn.execute(query, (TaskState.FINISHED.value,)).fetchone()[0])
