"""Retrying a finished job's failed nodes, end to end on the real control plane.

The retry annotation is set with kubectl, as an operator would. What is shown: a pre-pull of an
image missing from the registry completes once the image is pushed and the job retried, every node
pulling once more and keeping its first attempt in status; a controller killed between the
annotation and its handling (and the one after it) retries once and only once; one dying between
the retry's status write and its Event leaves the Event to the next, which shows it once; a late
report of the first attempt changes nothing during the second; an agent from before retries gets its retried node
failed with the reason instead of a RunAction it would mistake for the first one.
"""

from __future__ import annotations

import functools
import signal
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import msgspec
import pytest
import structlog

from flows.nodejobs.imageprepulljob import CHECK, PULL
from nodetask.clock import Clock
from nodetask.messages import Report
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from nodetask.route import Route
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import Kube, open_kube
from roles.kube.resources import EVENTS, NODES, job_resource
from schemas.core import HUB_ANNOTATION, Node
from schemas.kinds import IMAGE_PRE_PULL_JOB, KINDS
from schemas.v1alpha2 import API_VERSION
from tests.integration.agents import agent_command, write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import eventually, light_edge, running_controller, running_edges, running_hub
from tests.integration.objects import create_job, job_when, kubectl, polled, settled, unique
from tests.integration.processes import RoleProcess, fleet
from tests.integration.test_prepull_e2e import agents
from tools.ports import free_port
from tools.provision.containerd import Containerd, Registry

pytestmark = pytest.mark.integration
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
RETRY = "nodetask.kubeedge.io/retry"


async def retry(cp: ControlPlane, name: str, value: str) -> None:
    await kubectl(cp, "annotate", "--overwrite", "imageprepulljob", name, f"{RETRY}={value}")


def retried_to(attempt: int) -> Any:
    """The job settled after the retry that started run ``attempt`` (or a later one)."""
    return lambda job: settled(job) and job.status.retry is not None and job.status.retry.attempt >= attempt


async def events_of(cp: ControlPlane, name: str, reason: str) -> list[Any]:
    async with admin(cp) as kube:
        events, _, _ = await kube.list(EVENTS, namespace="default")
    return [e for e in events if e.involved_object.name == name and e.reason == reason]


def flow(entry: Any) -> list[tuple[str, ConditionStatus]]:
    return [(a.action, a.status) for a in entry.action_flow]


async def test_a_prepull_of_a_missing_image_completes_once_the_image_is_pushed_and_the_job_retried(
    crds: ControlPlane, cloud_kube: Kube, containerd: Containerd, registry: Registry, tmp_path: Path
) -> None:
    """Attempt 1 fails on every node (no such image); pushed and retried, attempt 2 pulls it on every node."""
    repository = unique("late")
    image = f"{registry.host}/{repository}:1"
    nodes = [unique("retry") for _ in range(2)]
    tokens = await register_edges(crds, nodes)
    name = unique("prepull-retry")
    async with running_controller(crds), running_hub(crds, "hub-retry") as hub:
        configs = [
            write_agent_config(
                tmp_path / n, node=n, token=tokens[n], hub_urls=[hub.url], criEndpoint=containerd.endpoint
            )
            for n in nodes
        ]
        async with agents([agent_command(c) for c in configs], tmp_path / "agents.log"):
            await create_job(
                crds,
                "ImagePrePullJob",
                name,
                {"imagePrePullTemplate": {"nodeNames": nodes, "images": [image], "concurrency": 2}},
            )
            failed = await job_when(cloud_kube, PREPULLS, name, settled, limit_s=90)
            assert failed.status.phase is JobPhase.FAILURE
            assert [e.phase for e in failed.status.node_status] == [NodeTaskPhase.FAILURE] * 2

            await anyio.to_thread.run_sync(registry.push, repository, "1")
            await retry(crds, name, "image-pushed")
            done = await job_when(cloud_kube, PREPULLS, name, retried_to(2), limit_s=90)

    assert done.status.phase is JobPhase.COMPLETED
    assert (done.status.retry.handled, done.status.retry.nodes) == ("image-pushed", 2)
    for before, entry in zip(failed.status.node_status, done.status.node_status, strict=True):
        assert (entry.phase, entry.attempt) == (NodeTaskPhase.SUCCESSFUL, 2)
        assert flow(entry) == [(CHECK, ConditionStatus.TRUE), (PULL, ConditionStatus.TRUE)]
        assert [(i.image, i.status) for i in entry.image_status] == [(image, ConditionStatus.TRUE)]
        previous = entry.previous_attempt
        assert previous is not None
        assert (previous.attempt, previous.phase, previous.action) == (1, NodeTaskPhase.FAILURE, PULL)
        assert previous.reason == before.reason
        assert previous.time == before.action_flow[-1].time
    [event] = await events_of(crds, name, "JobRetried")
    assert event.message.startswith("attempt 2: 2 nodes run again")


def _held_by_a_hub(node: Node) -> bool:
    return bool(node.metadata.annotations.get(HUB_ANNOTATION))


def _leading(metrics_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as answer:
            return "nodetaskd_controller_leader 1.0" in answer.read().decode()
    except OSError:
        return False


async def _until_leading(metrics_port: int) -> None:
    with anyio.fail_after(60):
        while True:
            if await anyio.to_thread.run_sync(_leading, metrics_port):
                return
            await anyio.sleep(0.2)


async def test_a_controller_killed_between_the_annotation_and_its_handling_retries_exactly_once(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """Leader frozen, annotated, killed; the standby retries; it is killed in turn mid-run; the first one, back,
    finishes the run without retrying again: one retry, one JobRetried Event, every node at attempt 2."""
    timeout = 10
    ghost = unique("ghost")  # a Node no agent serves: it times out, in each attempt
    await register_edges(crds, [ghost])
    async with fleet(crds, tmp_path, edges=2, hubs=1) as running:
        first = running.controller
        config = msgspec.yaml.decode(first.config.read_bytes())
        standby_port = free_port()
        standby_config = tmp_path / "standby.yaml"
        standby_config.write_bytes(
            msgspec.yaml.encode(config | {"identity": unique("standby"), "metricsPort": standby_port})
        )
        standby = RoleProcess("standby", standby_config, "controller", tmp_path / "standby.log")
        running.hubs.append(standby)  # stopped (and its exit checked) with the fleet
        await _until_leading(config["metricsPort"])
        await standby.start()

        for edge in running.edges:  # connected before the job: only the ghost may time out
            await polled(functools.partial(cloud_kube.get, NODES, edge), _held_by_a_hub, limit_s=60)
        name = unique("exactly-once")
        nodes = [*running.edges, ghost]
        # No container runtime on these agents: every Pull fails, in both attempts.
        spec: dict[str, object] = {
            "imagePrePullTemplate": {
                "nodeNames": nodes,
                "images": ["busybox:1"],
                "concurrency": 3,
                "timeoutSeconds": timeout,
            }
        }
        await create_job(crds, "ImagePrePullJob", name, spec)
        failed = await job_when(cloud_kube, PREPULLS, name, settled, limit_s=90)
        assert [e.phase for e in failed.status.node_status] == [NodeTaskPhase.FAILURE] * 2 + [NodeTaskPhase.UNKNOWN]

        assert first.process is not None
        first.process.send_signal(signal.SIGSTOP)  # holds the lease, handles nothing
        await retry(crds, name, "once")
        await first.kill()
        handled = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.retry is not None, limit_s=60)
        # Its Event follows the status write: killed in between, the standby would leave the retry unannounced.
        await polled(functools.partial(events_of, crds, name, "JobRetried"), bool)
        await standby.kill()
        assert handled.status.retry.attempt == 2
        # The retried run goes on: the ghost waits for its timeout, which only a controller can declare
        # (the standby may have declared it already on a slow machine: its timeout runs from the retry).
        unfinished = await cloud_kube.get(PREPULLS, name)
        assert unfinished.status.node_status[2].phase in (NodeTaskPhase.PENDING, NodeTaskPhase.UNKNOWN)
        assert unfinished.status.node_status[2].attempt == 2

        await first.start()
        await job_when(cloud_kube, PREPULLS, name, retried_to(2), limit_s=90)
        # Proof that the restarted controller has passed over the finished job since: it puts right a count
        # the test spoils, which it does only in a pass that found no retry to start.
        spoiled = msgspec.json.encode({"status": {"nodeCounts": {"total": 99}}}).decode()
        await kubectl(crds, "patch", "imageprepulljob", name, "--subresource=status", "--type=merge", "-p", spoiled)
        done = await job_when(
            cloud_kube, PREPULLS, name, lambda j: j.status.node_counts is not None and j.status.node_counts.total == 3
        )

    assert done.status.retry.attempt == 2
    assert done.status.phase is JobPhase.FAILURE
    assert done.status.retry.handled == "once"
    assert [(e.attempt, e.previous_attempt.attempt) for e in done.status.node_status] == [(2, 1)] * 3
    ghost_entry = done.status.node_status[2]
    assert ghost_entry.phase is NodeTaskPhase.UNKNOWN
    assert ghost_entry.previous_attempt.phase is NodeTaskPhase.UNKNOWN
    assert len(await events_of(crds, name, "JobRetried")) == 1
    assert all(code == 0 for p, code in running.exits.items() if not running.named(p).killed), running.exits


class DiesAtItsRetryEvent:
    """The controller's client until it records ``job``'s JobRetried Event: there the controller "dies"
    (blocks until cancelled, writing nothing more), before the Event or, ``after_event``, just after it."""

    def __init__(self, kube: Kube, job: str, *, after_event: bool) -> None:
        self._kube = kube
        self._job = job
        self._after_event = after_event
        self.died = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    async def create(self, resource: Any, obj: Any, *, namespace: str = "") -> Any:
        if resource is EVENTS and (obj.involved_object.name, obj.reason) == (self._job, "JobRetried"):
            if self._after_event:
                await self._kube.create(resource, obj, namespace=namespace)
            self.died.set()
            await anyio.sleep_forever()
        return await self._kube.create(resource, obj, namespace=namespace)


@asynccontextmanager
async def reconciling(kube: Kube | DiesAtItsRetryEvent) -> AsyncIterator[None]:
    """A controller's reconciler on ``kube`` for the block; leaving the block is the controller's end."""
    reconciler = Reconciler(kube=cast("Kube", kube), clock=Clock.start(), log=structlog.get_logger(), kinds=KINDS)
    async with anyio.create_task_group() as tg:
        await tg.start(reconciler.run)
        yield
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("after_event", [False, True], ids=["before-the-event", "after-the-event"])
async def test_a_controller_dying_between_a_retry_and_its_event_leaves_the_event_to_the_next_one(
    crds: ControlPlane, cloud_kube: Kube, after_event: bool
) -> None:
    """The retry's status is written and the controller dies before its JobRetried Event (or just after it):
    the next controller records the Event, and it shows once."""
    gone = unique("gone")  # no such Node: the job fails at once, and its retry judges the node again at once
    name = unique("owed-event")
    await create_job(
        crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"nodeNames": [gone], "images": ["a/b:1"]}}
    )
    async with open_kube(kubeconfig=str(crds.kubeconfig("controller")), log=structlog.get_logger()) as kube:
        dying = DiesAtItsRetryEvent(kube, name, after_event=after_event)
        async with reconciling(dying):
            await job_when(cloud_kube, PREPULLS, name, settled)
            await retry(crds, name, "again")
            with anyio.fail_after(60):
                await dying.died.wait()
        handled = await cloud_kube.get(PREPULLS, name)
        assert handled.status.retry.handled == "again"  # the decision was written before the death
        assert len(await events_of(crds, name, "JobRetried")) == int(after_event)

        async with reconciling(kube):
            [event] = await polled(functools.partial(events_of, crds, name, "JobRetried"), bool)
            done = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.retry.pending_event is None)

    assert (event.type, event.message) == ("Normal", f"attempt 2: 0 nodes run again; 1 judged at once ({gone})")
    assert len(await events_of(crds, name, "JobRetried")) == 1
    assert (done.status.retry.handled, done.status.retry.attempt) == ("again", 2)


async def test_a_late_report_of_the_first_attempt_arriving_during_the_second_changes_nothing(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """Attempt 1's Pull failure, delivered again while attempt 2 runs, is acknowledged and leaves attempt 2 alone."""
    node = unique("late")
    tokens = await register_edges(crds, [node])
    name = unique("late-report")
    async with running_controller(crds), running_hub(crds, "hub-late") as hub:
        edge = light_edge(node, hub.url, tokens[node], fail=frozenset({PULL}))
        async with running_edges([edge]):
            await create_job(
                crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"nodeNames": [node], "images": ["a/b:1"]}}
            )
            failed = await job_when(cloud_kube, PREPULLS, name, settled)
            assert failed.status.phase is JobPhase.FAILURE
            uid = failed.metadata.uid

            edge.fail, edge.delay = frozenset(), 3.0  # attempt 2 succeeds, slowly
            await retry(crds, name, "2")
            running = await job_when(
                cloud_kube, PREPULLS, name, lambda j: j.status.node_status[0].phase is NodeTaskPhase.IN_PROGRESS
            )
            assert running.status.node_status[0].attempt == 2
            route = Route(API_VERSION, "imageprepulljob", name, node)
            late = Report(route=route, job_uid=uid, seq=10_000, action=PULL, succ=False, reason="late", attempt=1)
            edge.outbox[late.seq] = late
            await edge.send(late)
            await eventually(lambda: late in edge.acked)
            during = await cloud_kube.get(PREPULLS, name)
            entry = during.status.node_status[0]
            assert (entry.phase, entry.attempt) == (NodeTaskPhase.IN_PROGRESS, 2)
            assert (PULL, ConditionStatus.FALSE) not in flow(entry)

            done = await job_when(cloud_kube, PREPULLS, name, retried_to(2))
    assert done.status.phase is JobPhase.COMPLETED
    assert flow(done.status.node_status[0]) == [(CHECK, ConditionStatus.TRUE), (PULL, ConditionStatus.TRUE)]


async def test_an_agent_from_before_retries_gets_its_retried_node_failed_with_the_reason(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """A node whose agent knows no attempts is not sent the retry (it would resend attempt 1): it fails, saying why."""
    old, new = unique("old-agent"), unique("new-agent")
    tokens = await register_edges(crds, [old, new])
    name = unique("mixed")
    async with running_controller(crds), running_hub(crds, "hub-mixed") as hub:
        edges = [
            light_edge(old, hub.url, tokens[old], fail=frozenset({PULL}), attempts=False, version="v0.9.0"),
            light_edge(new, hub.url, tokens[new], fail=frozenset({PULL})),
        ]
        async with running_edges(edges):
            spec: dict[str, object] = {
                "imagePrePullTemplate": {"nodeNames": [old, new], "images": ["a/b:1"], "concurrency": 2}
            }
            await create_job(crds, "ImagePrePullJob", name, spec)
            await job_when(cloud_kube, PREPULLS, name, settled)
            for edge in edges:
                edge.fail = frozenset()
            await retry(crds, name, "1")
            done = await job_when(cloud_kube, PREPULLS, name, retried_to(2))
        runs_of_old = [r for r in edges[0].run_actions if r.route.job == name]
    by_node = {e.node_name: e for e in done.status.node_status}
    assert by_node[new].phase is NodeTaskPhase.SUCCESSFUL
    assert by_node[old].phase is NodeTaskPhase.FAILURE
    assert "(version v0.9.0) cannot run a retry" in by_node[old].reason
    assert [r.attempt for r in runs_of_old] == [1]  # the retry never reached it
