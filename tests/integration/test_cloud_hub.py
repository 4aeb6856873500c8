"""The cloud hub on the real control plane with real websockets on loopback and light edges."""

from __future__ import annotations

import functools
import urllib.error
import urllib.request
from typing import Any

import anyio
import msgspec
import pytest
import structlog
import trio_websocket

from flows.nodejobs import imageprepulljob
from nodetask import messages
from nodetask.messages import PING_CAPABILITY, Error, Heartbeat, Hello, Report, Welcome
from nodetask.phases import JobPhase, NodeTaskPhase
from nodetask.route import Route
from roles.common.health import router, serve_http
from roles.kube import Kube, NotFound
from roles.kube.resources import EVENTS, NODES, job_resource
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.v1alpha2 import ImagePrePullNodeTaskStatus
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import (
    eventually,
    light_edge,
    peak_overlap,
    running_controller,
    running_edges,
    running_hub,
)
from tests.integration.objects import create_job, job_when, kubectl, unique
from tools.ports import free_port

pytestmark = pytest.mark.integration
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)


def _prepull(nodes: list[str], *, concurrency: int = 1, timeout: int = 60) -> dict[str, object]:
    template = {
        "nodeNames": nodes,
        "concurrency": concurrency,
        "timeoutSeconds": timeout,
        "images": ["registry.local/app:1", "registry.local/db:2"],
    }
    return {"imagePrePullTemplate": template}


def _assert_each_action_once(job: Any) -> None:
    for entry in job.status.node_status:
        actions = [a.action for a in entry.action_flow]
        assert actions == ["Check", "Pull"], (entry.node_name, actions)


async def test_job_completes_across_two_hubs_within_its_concurrency(crds: ControlPlane, cloud_kube: Kube) -> None:
    """Edges split over two hubs all finish, no node fails falsely, and at most `concurrency` run at once."""
    nodes = [unique("hub2") for _ in range(6)]
    tokens = await register_edges(crds, nodes)
    name = unique("across")
    async with (
        running_controller(crds),
        running_hub(crds, "hub-a") as a,
        running_hub(crds, "hub-b") as b,
        running_edges(
            # Actions long enough that the second claim lands while the first node still runs.
            light_edge(n, (a if i % 2 else b).url, tokens[n], delay=0.5)
            for i, n in enumerate(nodes)
        ) as edges,
    ):
        await create_job(crds, "ImagePrePullJob", name, _prepull(nodes, concurrency=2))
        job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert [e.phase for e in job.status.node_status] == [NodeTaskPhase.SUCCESSFUL] * 6
    _assert_each_action_once(job)
    assert all(e.dispatch_time for e in job.status.node_status)
    assert all(img.status == "True" for e in job.status.node_status for img in e.image_status)
    intervals = [i for edge in edges for i in edge.intervals.values()]
    assert len(intervals) == 6
    assert peak_overlap(intervals) == 2
    assert {len(r.dispatched) for r in a.hub.runners()} | {len(r.dispatched) for r in b.hub.runners()} <= {0, 1, 2, 3}
    assert sum(len(r.dispatched) for r in a.hub.runners()) == 3
    assert sum(len(r.dispatched) for r in b.hub.runners()) == 3


async def _job_reads(cp: ControlPlane) -> float:
    """GETs of single ImagePrePullJobs the API server has answered since it started (its own count)."""
    metrics = (await kubectl(cp, "get", "--raw", "/metrics")).stdout
    wanted = ('resource="imageprepulljobs"', 'subresource=""', 'verb="GET"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("apiserver_request_total{") and all(label in line for label in wanted)
    )


async def test_a_claim_waiting_for_a_slot_reads_the_job_only_once_the_slot_frees(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """While another hub's node holds the only slot, changes of the job that free none (labels, that node's
    progress) cost no read of the job; once that node ends, the waiting node is claimed and runs to the end."""
    busy, waiting = unique("busy"), unique("waiting")
    tokens = await register_edges(crds, [busy, waiting])
    name = unique("full")
    await create_job(crds, "ImagePrePullJob", name, _prepull([busy, waiting], concurrency=1))

    def entries(j: Any, busy_phase: NodeTaskPhase, reason: str = "") -> Any:
        first, second = (
            ImagePrePullNodeTaskStatus(node_name=busy, phase=busy_phase, reason=reason),
            ImagePrePullNodeTaskStatus(node_name=waiting, phase=NodeTaskPhase.PENDING),
        )
        status = msgspec.structs.replace(j.status, phase=JobPhase.IN_PROGRESS, node_status=(first, second))
        return msgspec.structs.replace(j, status=status)

    # As the controller and another hub leave it: the busy node InProgress, the other Pending.
    await cloud_kube.update_status(PREPULLS, name, functools.partial(entries, busy_phase=NodeTaskPhase.IN_PROGRESS))
    before = await _job_reads(crds)
    async with (
        running_hub(crds, "hub-full") as hub,
        admin(crds) as kube,
        running_edges([light_edge(waiting, hub.url, tokens[waiting])]),
    ):
        with anyio.fail_after(20):
            while True:  # until the claim's fresh read has found the slot taken
                reads = await _job_reads(crds)
                if reads > before:
                    break
                await anyio.sleep(0.1)
        (runner,) = hub.hub.runners()
        for step in range(10):
            if step % 2:
                progress = entries(runner.job, NodeTaskPhase.IN_PROGRESS, reason=f"pulling, step {step}")
                patch = {"status": {"nodeStatus": msgspec.to_builtins(progress.status.node_status)}}
                changed = await kube.merge_patch(PREPULLS, name, patch, subresource="status")
            else:
                changed = await kube.merge_patch(PREPULLS, name, {"metadata": {"labels": {"step": str(step)}}})
            version = changed.metadata.resource_version
            await eventually(lambda: runner.job.metadata.resource_version == version)  # noqa: B023
            await anyio.sleep(0.3)  # time enough for a claim to go out again (the window is 0.05 s)
        assert await _job_reads(crds) == reads
        assert runner.dispatched == []
        done = entries(runner.job, NodeTaskPhase.SUCCESSFUL)
        patch = {"status": {"nodeStatus": msgspec.to_builtins(done.status.node_status)}}
        await kube.merge_patch(PREPULLS, name, patch, subresource="status")
        job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.node_status[1].phase.terminal)
    assert [e.phase for e in job.status.node_status] == [NodeTaskPhase.SUCCESSFUL] * 2
    assert [node for node, _ in runner.dispatched] == [waiting]


async def test_hub_restarted_mid_job_finishes_it_without_losing_or_repeating_results(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """A hub stopped while nodes are in flight and started again resumes them and the Pending ones."""
    nodes = [unique("restart") for _ in range(4)]
    tokens = await register_edges(crds, nodes)
    name = unique("restart")
    port = free_port()
    edges = [light_edge(n, f"ws://127.0.0.1:{port}", tokens[n], delay=0.4) for n in nodes]
    async with running_controller(crds), anyio.create_task_group() as fleet:
        # The edges outlive the first hub: they keep their outbox and reconnect to the second.
        for edge in edges:
            fleet.start_soon(edge.run)
        async with running_hub(crds, "hub-r", port=port):
            await create_job(crds, "ImagePrePullJob", name, _prepull(nodes, concurrency=2))
            await job_when(
                cloud_kube, PREPULLS, name, lambda j: any(a for e in j.status.node_status for a in e.action_flow)
            )
        async with running_hub(crds, "hub-r", port=port):
            job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
        fleet.cancel_scope.cancel()
    assert [e.phase for e in job.status.node_status] == [NodeTaskPhase.SUCCESSFUL] * 4
    _assert_each_action_once(job)
    assert peak_overlap(i for edge in edges for i in edge.intervals.values()) <= 2
    assert all(edge.connects >= 2 for edge in edges if edge.intervals)


async def test_edge_that_drops_mid_flow_reconnects_and_finishes(crds: ControlPlane, cloud_kube: Kube) -> None:
    """An edge whose connection is cut after its first report reconnects, flushes its outbox and finishes."""
    nodes = [unique("drop")]
    tokens = await register_edges(crds, nodes)
    name = unique("drop")
    async with running_controller(crds), running_hub(crds, "hub-d") as hub:
        edge = light_edge(nodes[0], hub.url, tokens[nodes[0]], delay=0.5)
        async with running_edges([edge]):
            await create_job(crds, "ImagePrePullJob", name, _prepull(nodes))
            await eventually(lambda: edge.acked)
            edge.cut()
            job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    _assert_each_action_once(job)
    assert edge.connects >= 2


async def test_report_for_another_node_is_refused(crds: ControlPlane, cloud_kube: Kube) -> None:
    """A session may only report for its own node: a report naming another node is refused, not applied."""
    nodes = [unique("own"), unique("other")]
    tokens = await register_edges(crds, nodes)
    name = unique("foreign")
    async with running_controller(crds), running_hub(crds, "hub-f") as hub:
        await create_job(crds, "ImagePrePullJob", name, _prepull(nodes[1:]))
        job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.node_status)
        edge = light_edge(nodes[0], hub.url, tokens[nodes[0]])
        async with running_edges([edge]):
            route = Route("operations.kubeedge.io/v1alpha2", "imageprepulljob", name, nodes[1])
            await edge.send(Report(route=route, job_uid=job.metadata.uid, seq=1, action="Check", succ=True))
            await eventually(lambda: edge.errors)
    assert edge.errors[0].code == "foreign_node"
    assert edge.errors[0].ref == "1"
    assert hub.registry.get_sample_value("nodetaskd_hub_rejected_frames_total", {"reason": "foreign_node"}) == 1
    job = await cloud_kube.get(PREPULLS, name)
    assert job.status.node_status[0].action_flow == ()


async def test_bad_frames_get_an_error_and_the_session_survives(crds: ControlPlane) -> None:
    """Malformed, unknown and oversized frames are answered or closed, never crash the hub."""
    node = unique("bad")
    tokens = await register_edges(crds, [node])
    headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
    async with running_hub(crds, "hub-x") as hub:
        url = f"{hub.url}/nodes/{node}"
        async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
            await ws.send_message(messages.encode(Hello(node=node, version="v1")))
            assert isinstance(messages.decode_downstream(await ws.get_message()), Welcome)
            frames: list[str | bytes] = [
                "not json",
                '{"op": "teleport"}',
                '{"op": "report", "route": "a/b", "seq": 1}',
                b"\xff",
            ]
            for frame in frames:
                await ws.send_message(frame)
                reply = messages.decode_downstream(await ws.get_message())
                assert isinstance(reply, Error)
                assert reply.code == "malformed"
            await ws.send_message(messages.encode(Heartbeat(sent_at=1.0)))
            assert messages.decode_downstream(await ws.get_message()) == Heartbeat(sent_at=1.0)

            async def send_oversized() -> None:
                # The hub may close while the frame is still being sent, or answer the close after.
                await ws.send_message("x" * (2 << 20))
                await ws.get_message()

            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await send_oversized()
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1009
        # The hub still serves the next session.
        async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
            await ws.send_message(messages.encode(Hello(node=node, version="v1")))
            assert isinstance(messages.decode_downstream(await ws.get_message()), Welcome)
    assert hub.registry.get_sample_value("nodetaskd_hub_rejected_frames_total", {"reason": "malformed"}) == 4


async def test_an_edge_that_only_pings_keeps_its_session_until_it_goes_quiet_for_three_intervals(
    crds: ControlPlane,
) -> None:
    """Websocket pings alone keep a session through six heartbeat intervals; three silent ones close it with 4008."""
    node = unique("ping")
    tokens = await register_edges(crds, [node])
    headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
    async with running_hub(crds, "hub-ping", heartbeat=0.5) as hub:
        url = f"{hub.url}/nodes/{node}"
        async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
            await ws.send_message(messages.encode(Hello(node=node, version="v1", capabilities=(PING_CAPABILITY,))))
            welcome = messages.decode_downstream(await ws.get_message())
            assert isinstance(welcome, Welcome)
            assert PING_CAPABILITY in welcome.capabilities
            for _ in range(6):
                await ws.ping()  # answered by the hub's websocket layer
                await anyio.sleep(0.5)
            assert ws.closed is None
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await ws.get_message()  # nothing comes until the hub gives up on the quiet edge
            assert closed.value.reason is not None
            assert closed.value.reason.code == 4008
    assert hub.registry.get_sample_value("nodetaskd_hub_messages_in_total", {"op": "heartbeat"}) is None


# The frame from the hardening report: a valid heartbeat with an unknown field nested 10,000 deep.
DEEP_FRAME = '{"op":"heartbeat","x":' + "[" * 10_000 + "]" * 10_000 + "}"


async def test_deeply_nested_frames_are_refused_and_the_hub_serves_on(crds: ControlPlane, cloud_kube: Kube) -> None:
    """A frame nested 10,000 deep, as the Hello or later, is refused naming the limit; another edge's job completes."""
    node, other = unique("deep"), unique("deep")
    tokens = await register_edges(crds, [node, other])
    headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
    name = unique("deep")
    async with (
        running_controller(crds),
        running_hub(crds, "hub-deep") as hub,
        running_edges([light_edge(other, hub.url, tokens[other])]),
    ):
        url = f"{hub.url}/nodes/{node}"
        async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
            await ws.send_message(DEEP_FRAME)
            bad_hello = messages.decode_downstream(await ws.get_message())
            with pytest.raises(trio_websocket.ConnectionClosed):
                await ws.get_message()
        async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
            await ws.send_message(messages.encode(Hello(node=node, version="v1")))
            assert isinstance(messages.decode_downstream(await ws.get_message()), Welcome)
            await ws.send_message(DEEP_FRAME.encode())
            malformed = messages.decode_downstream(await ws.get_message())
            await ws.send_message(messages.encode(Heartbeat(sent_at=2.0)))
            assert messages.decode_downstream(await ws.get_message()) == Heartbeat(sent_at=2.0)
        await create_job(crds, "ImagePrePullJob", name, _prepull([other]))
        job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert isinstance(bad_hello, Error)
    assert bad_hello.code == "bad_hello"
    assert "nested too deeply: more than 64 levels" in bad_hello.message
    assert isinstance(malformed, Error)
    assert malformed.code == "malformed"
    assert "nested too deeply: more than 64 levels" in malformed.message
    assert [e.phase for e in job.status.node_status] == [NodeTaskPhase.SUCCESSFUL]


@pytest.mark.parametrize(
    ("token", "status"),
    [("", 401), ("wrong-token", 403)],
)
async def test_handshake_without_the_nodes_token_is_rejected(crds: ControlPlane, token: str, status: int) -> None:
    """An edge without a bearer token, or with a wrong one, is refused before any frame."""
    node = unique("auth")
    await register_edges(crds, [node])
    async with running_hub(crds, "hub-auth") as hub:
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with trio_websocket.open_websocket_url(f"{hub.url}/nodes/{node}", extra_headers=headers):
                pass
    assert rejected.value.status_code == status
    assert hub.registry.get_sample_value("nodetaskd_hub_auth_failures_total", {"status": str(status)}) == 1


async def test_token_of_one_node_does_not_open_another_nodes_session(crds: ControlPlane) -> None:
    """A valid token is bound to its node: presenting it for another node is refused."""
    mine, theirs = unique("mine"), unique("theirs")
    tokens = await register_edges(crds, [mine, theirs])
    async with running_hub(crds, "hub-bind") as hub:
        headers = [(b"authorization", f"Bearer {tokens[mine]}".encode())]
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with trio_websocket.open_websocket_url(f"{hub.url}/nodes/{theirs}", extra_headers=headers):
                pass
    assert rejected.value.status_code == 403


async def test_session_is_recorded_on_the_node_and_cleared_when_it_ends(crds: ControlPlane) -> None:
    """The hub writes which instance holds the node and the agent version, and removes the hub on disconnect."""
    node = unique("mark")
    tokens = await register_edges(crds, [node])
    async with admin(crds) as kube, running_hub(crds, "hub-m") as hub:
        async with running_edges([light_edge(node, hub.url, tokens[node], version="v1.2.3")]):
            # The Node is marked just after the Welcome, which is all running_edges waits for.
            with anyio.fail_after(10):
                while True:
                    marked = await kube.get(NODES, node)
                    if HUB_ANNOTATION in marked.metadata.annotations:
                        break
                    await anyio.sleep(0.05)
        with anyio.fail_after(10):
            while True:
                cleared = await kube.get(NODES, node)
                if HUB_ANNOTATION not in cleared.metadata.annotations:
                    break
                await anyio.sleep(0.05)
    assert marked.metadata.annotations[HUB_ANNOTATION] == "hub-m"
    assert marked.metadata.annotations[AGENT_VERSION_ANNOTATION] == "v1.2.3"
    assert cleared.metadata.annotations[AGENT_VERSION_ANNOTATION] == "v1.2.3"


async def test_stopping_the_hub_closes_sessions_with_going_away(crds: ControlPlane) -> None:
    """A hub shutting down sends every edge a 1001 close frame so they reconnect elsewhere at once."""
    node = unique("bye")
    tokens = await register_edges(crds, [node])
    edge = light_edge(node, "", tokens[node], reconnect_delay=30)
    async with running_edges([]) as _, anyio.create_task_group() as tg:
        async with running_hub(crds, "hub-bye") as hub:
            edge.url = hub.url
            await tg.start(edge.run)
        await eventually(lambda: edge.close_codes)
        tg.cancel_scope.cancel()
    assert edge.close_codes == [1001]


def _post(url: str, body: bytes, token: str) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


async def test_kubeedge_http_status_endpoint_records_a_report_as_that_node(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """POST /task/{type}/name/{job}/node/{node}/status writes the result, authenticated as the node."""
    mine, other = unique("http"), unique("http")
    tokens = await register_edges(crds, [mine, other])
    name = unique("http")
    async with running_controller(crds), running_hub(crds, "hub-http") as hub, anyio.create_task_group() as tg:
        port = await tg.start(
            functools.partial(
                serve_http, router(hub.hub.http_routes()), host="127.0.0.1", port=0, log=structlog.get_logger()
            )
        )
        await create_job(crds, "ImagePrePullJob", name, _prepull([mine]))
        await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.node_status)
        base = f"http://127.0.0.1:{port}/task/imageprepulljob/name/{name}/node"
        body = b'{"action": "Check", "succ": true, "finishTime": "2026-11-26T01:00:00Z"}'
        answers = [
            await anyio.to_thread.run_sync(_post, f"{base}/{mine}/status", body, "wrong"),
            await anyio.to_thread.run_sync(_post, f"{base}/{mine}/status", body, tokens[other]),
            await anyio.to_thread.run_sync(_post, f"{base}/{mine}/status", b'{"succ": "yes"}', tokens[mine]),
            await anyio.to_thread.run_sync(_post, f"{base}/{mine}/status", body, tokens[mine]),
            await anyio.to_thread.run_sync(_post, f"{base}/{mine}/status", body, tokens[mine]),
        ]
        tg.cancel_scope.cancel()
    assert [code for code, _ in answers] == [403, 403, 400, 200, 200]
    assert answers[2][1].startswith("malformed action result")
    job = await cloud_kube.get(PREPULLS, name)
    assert [(a.action, a.time) for a in job.status.node_status[0].action_flow] == [("Check", "2026-11-26T01:00:00Z")]


async def test_kubeedge_http_status_endpoint_answers_a_deeply_nested_body_with_400(crds: ControlPlane) -> None:
    """A report body nested 10,000 deep gets 400 naming the limit, and the endpoint goes on answering."""
    node = unique("http")
    tokens = await register_edges(crds, [node])
    async with running_hub(crds, "hub-http-deep") as hub, anyio.create_task_group() as tg:
        port = await tg.start(
            functools.partial(
                serve_http, router(hub.hub.http_routes()), host="127.0.0.1", port=0, log=structlog.get_logger()
            )
        )
        url = f"http://127.0.0.1:{port}/task/imageprepulljob/name/{unique('none')}/node/{node}/status"
        deep = await anyio.to_thread.run_sync(_post, url, DEEP_FRAME.encode(), tokens[node])
        after = await anyio.to_thread.run_sync(_post, url, b'{"action": "Check", "succ": true}', tokens[node])
        tg.cancel_scope.cancel()
    assert deep[0] == 400
    assert deep[1].startswith("malformed action result frame: nested too deeply: more than 64 levels")
    assert after[0] == 404  # decoded, and no such job


async def test_job_recreated_under_the_same_name_gets_a_fresh_runner_after_the_old_one_unwound(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """Deleting a job mid-flight stops its runner; a new job of the same name runs from scratch."""
    nodes = [unique("again") for _ in range(3)]
    tokens = await register_edges(crds, nodes)
    name = unique("again")
    held = anyio.Event()
    async with (
        running_controller(crds),
        running_hub(crds, "hub-again") as hub,
        # The first job's actions are held until it is deleted, however long its deletion takes to reach the hub.
        running_edges(light_edge(n, hub.url, tokens[n], gate=held) for n in nodes) as edges,
    ):
        await create_job(crds, "ImagePrePullJob", name, _prepull(nodes, concurrency=1))
        first = await cloud_kube.get(PREPULLS, name)
        with anyio.fail_after(60):
            while True:
                if any(edge.run_actions for edge in edges):
                    break
                await anyio.sleep(0.1)
        # kubectl blocks this thread: never let it wait for the finalizer the controller must remove.
        await kubectl(crds, "delete", "imageprepulljob", name, "--wait=false")
        with anyio.fail_after(20):
            while True:
                try:
                    await cloud_kube.get(PREPULLS, name)
                except NotFound:
                    break
                await anyio.sleep(0.1)
        with anyio.fail_after(60):
            while True:
                if any(edge.cancels for edge in edges):
                    break
                await anyio.sleep(0.1)
        held.set()
        await create_job(crds, "ImagePrePullJob", name, _prepull(nodes, concurrency=1))
        second = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert second.metadata.uid != first.metadata.uid
    _assert_each_action_once(second)
    old, new = [r for r in hub.hub.runners() if r.name == name]
    assert (old.uid, new.uid) == (first.metadata.uid, second.metadata.uid)
    assert old.finished.is_set()
    assert len(old.dispatched) == 1  # concurrency 1: the deletion stopped it after its first node
    assert [node for node, _ in new.dispatched] == nodes
    assert old.dispatched[0][1] < new.dispatched[0][1]
    # The edge working on the deleted job was told to stop; the others never heard of it.
    cancelled = [c for edge in edges for c in edge.cancels]
    assert [(c.route.node, c.job_uid) for c in cancelled] == [(old.dispatched[0][0], first.metadata.uid)]


async def test_a_status_etcd_refuses_as_too_large_is_reported_on_the_job_and_the_report_kept(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """etcd's "request is too large" becomes one Warning Event on the job; the report is never acknowledged."""
    node = unique("huge")
    name = unique("huge")
    await register_edges(crds, [node])
    async with admin(crds) as kube, running_controller(crds), running_hub(crds, "hub-huge") as hub:
        await create_job(crds, "ImagePrePullJob", name, _prepull([node]))
        await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.node_status)
        # Recorded twice in the entry (the action's reason and the node's): over etcd's 1.5 MiB, under
        # the API server's 3 MiB, so it is etcd that refuses.
        result = messages.ActionResult(action="Check", succ=False, reason="x" * 800_000)
        outcome: list[object] = []
        async with anyio.create_task_group() as tg:

            async def report() -> None:
                outcome.append(
                    await hub.hub.record(
                        imageprepulljob.JOB_TYPE, name, node, result, uid="", log=structlog.get_logger()
                    )
                )

            tg.start_soon(report)

            async def warned() -> list[Any]:
                events, _, _ = await kube.list(EVENTS, namespace="default")
                return [e for e in events if e.involved_object.name == name and e.reason == "StatusTooLarge"]

            def refused() -> float:
                value = hub.registry.get_sample_value(
                    "nodetaskd_hub_status_write_failures_total", {"too_large": "true"}
                )
                return value or 0.0

            with anyio.fail_after(30):
                while True:
                    found = await warned()
                    if found:
                        break
                    await anyio.sleep(0.2)
            # The report is retried with backoff: wait for two more refusals, then still one Event.
            seen = refused()
            await eventually(lambda: refused() >= seen + 2, limit_s=30)
            again = await warned()
            tg.cancel_scope.cancel()
    assert outcome == []  # never acknowledged: the edge keeps the report
    assert len(again) == 1
    assert found[0].type == "Warning"
    assert "request is too large" in found[0].message
    job = await cloud_kube.get(PREPULLS, name)
    assert job.status.node_status[0].action_flow == ()
