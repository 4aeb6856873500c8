"""A hub's front door on the real control plane: hostile node names, failing handlers, connection caps, huge frames.

Every test here was a way to crash a hub, steer its API requests or grow it without bound.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import anyio
import msgspec
import pytest
import structlog
import trio
import trio_websocket
from structlog.testing import capture_logs

from nodetask import messages
from nodetask.messages import Error, Heartbeat, Hello, Report, Welcome, parse_route
from nodetask.phases import JobPhase, NodeTaskPhase
from nodetask.route import Route
from roles.cloud.hub import Hub
from roles.cloud.transport import door
from roles.common.health import router, serve_http
from roles.kube import Kube, NotFound
from roles.kube.resources import NODES, SECRETS, job_resource
from schemas.core import HUB_ANNOTATION, Secret
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import RunningHub, eventually, light_edge, running_controller, running_edges, running_hub
from tests.integration.objects import create_job, job_when, unique

pytestmark = pytest.mark.integration
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
LOOPBACK = "127.0.0.1"


def port_of(hub: RunningHub) -> int:
    return int(hub.url.rsplit(":", 1)[1])


async def handshake(port: int, path: str, token: str) -> tuple[int, bytes]:
    """Open a websocket at ``path`` exactly as written (no URL parsing); 101, or the refusal's status and body."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    try:
        async with trio_websocket.open_websocket(LOOPBACK, port, path, use_ssl=False, extra_headers=headers):
            return 101, b""
    except trio_websocket.ConnectionRejected as rejected:
        return rejected.status_code or 0, rejected.body or b""


async def raw_exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` on a new TCP connection and return all that comes back until the hub closes it."""
    stream = await trio.open_tcp_stream(LOOPBACK, port)
    async with stream:
        if request:
            await stream.send_all(request)
        received = b""
        with anyio.fail_after(20):
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return received
                if not chunk:
                    return received
                received += chunk


def metric(hub: RunningHub, name: str, **labels: str) -> float:
    return hub.registry.get_sample_value(name, labels) or 0.0


def _prepull(nodes: list[str]) -> dict[str, object]:
    return {"imagePrePullTemplate": {"nodeNames": nodes, "images": ["registry.local/app:1"], "timeoutSeconds": 60}}


# ------------------------------------------------------------------------------------ node names


async def test_hostile_node_names_in_the_websocket_path_are_refused_before_anything_else(crds: ControlPlane) -> None:
    """Path tricks, fragments and malformed names get 400 whatever token comes with them; the hub serves on."""
    node = unique("named")
    tokens = await register_edges(crds, [node])
    token = tokens[node]
    async with admin(crds) as kube:
        # A Secret with a `token` key elsewhere in the cluster, which `..` once reached.
        stolen = Secret(
            metadata=ObjectMeta(name=unique("stolen"), namespace="default"),
            type="Opaque",
            data={"token": base64.b64encode(b"stolen-token").decode()},
        )
        await kube.create(SECRETS, stolen, namespace="default")
    table = [
        ("/nodes/x/../../../../../../healthz", "x", 400),
        (f"/nodes/x/../../../default/secrets/{stolen.metadata.name}", "stolen-token", 400),
        (f"/nodes/{node}#x", token, 400),
        (f"/nodes/{node}/", token, 400),
        (f"/nodes/{node}/../{node}", token, 400),
        (f"/nodes/{node.upper()}", token, 400),
        ("/nodes/..", token, 400),
        ("/nodes/.", token, 400),
        ("/nodes/", token, 400),
        (f"/nodes/{node}%2F..%2F..%2Fhealthz", token, 400),
        (f"/nodes/{node}%00", token, 400),
        (f"/nodes/{'a' * 254}", token, 400),
        (f"/nodes/{node}.", token, 400),
        (f"/{node}", token, 404),
        (f"/nodes/{node}", "wrong", 403),
        (f"/nodes/{node}?the=query&is=not/part/../of/the/name", token, 101),
    ]
    async with running_hub(crds, "hub-names") as hub:
        answers = [(path, await handshake(port_of(hub), path, tok)) for path, tok, _ in table]
        assert [(path, status) for path, (status, _) in answers] == [(path, want) for path, _, want in table]
        for path, (status, body) in answers:
            if status == 400:
                assert b"node name" in body, path
                assert len(body) < 1024, path
        assert metric(hub, "nodetaskd_hub_auth_failures_total", status="400") == 13
        async with admin(crds) as kube:
            assert HUB_ANNOTATION not in (await kube.get(NODES, node)).metadata.annotations
        # Still serving: the node's own edge connects and is marked.
        async with running_edges([light_edge(node, hub.url, token)]):
            await eventually(lambda: node in hub.hub.sessions)
    assert metric(hub, "nodetaskd_hub_connection_errors_total", transport="websocket") == 0


async def test_hostile_names_at_the_kubeedge_report_endpoint_are_refused(crds: ControlPlane) -> None:
    """POST /task/.../node/<node>/status takes only a valid node and job name (400 otherwise)."""
    node = unique("httpname")
    tokens = await register_edges(crds, [node])
    job = unique("httpjob")
    async with running_hub(crds, "hub-http-names") as hub, anyio.create_task_group() as tg:
        port = await tg.start(
            functools.partial(
                serve_http, router(hub.hub.http_routes()), host=LOOPBACK, port=0, log=structlog.get_logger()
            )
        )
        body = b'{"action": "Check", "succ": true}'

        async def post(job_name: str, node_name: str) -> bytes:
            head = (
                f"POST /task/imageprepulljob/name/{job_name}/node/{node_name}/status HTTP/1.1\r\n"
                f"host: hub\r\nauthorization: Bearer {tokens[node]}\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n"
            )
            return await raw_exchange(port, head.encode() + body)

        answers = [
            await post(job, f"{node}#x"),
            await post(job, ".."),
            await post(job, node.upper()),
            await post(job, f"{node}%2F.."),
            await post(job, "a" * 254),
            await post(f"{job}#x", node),
            await post("..", node),
        ]
        tg.cancel_scope.cancel()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b" name " in answer


async def test_the_api_client_never_lets_a_name_change_the_request(crds: ControlPlane, cloud_kube: Kube) -> None:
    """Against the real API server, a hostile name reaches no other object: not found, or refused before sending."""
    node = unique("quoted")
    await register_edges(crds, [node])
    for name in [f"{node}#x", f"{node}?x=1", f"{node} x", f"{node};x"]:
        with pytest.raises(NotFound):
            await cloud_kube.get(NODES, name)
    # The API server decodes %2F before routing: `<node>%2Fstatus` would read the Node's status.
    for name in [f"{node}/status", f"{node}/", "..", ".", "x/../../../../healthz", f"x%2F{node}"]:
        with pytest.raises(ValueError, match="cannot be an API path segment"):
            await cloud_kube.get(NODES, name)
    assert (await cloud_kube.get(NODES, node)).metadata.name == node


# ------------------------------------------------------------------------------- supervision


async def _drain(ws: trio_websocket.WebSocketConnection) -> None:
    """Read frames until the connection closes (which raises ConnectionClosed)."""
    while True:
        await ws.get_message()


def failing_for(victim: str) -> type[Hub]:
    """A hub whose report handling raises an unexpected error for ``victim`` only."""

    class FailingHub(Hub):
        async def _apply_report(self, session: Any, report: Report, log: Any) -> None:
            if session.node == victim:
                raise RuntimeError("injected fault")
            await super()._apply_report(session, report, log)

    return FailingHub


async def test_an_unexpected_error_in_one_session_ends_only_that_connection(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """The failing session is closed, logged and counted; another edge's job still completes."""
    victim, good = unique("victim"), unique("good")
    tokens = await register_edges(crds, [victim, good])
    name = unique("survive")
    with capture_logs() as logs:
        async with (
            running_controller(crds),
            running_hub(crds, "hub-fault", hub_type=failing_for(victim)) as hub,
            running_edges([light_edge(good, hub.url, tokens[good])]),
        ):
            headers = [(b"authorization", f"Bearer {tokens[victim]}".encode())]
            async with trio_websocket.open_websocket_url(f"{hub.url}/nodes/{victim}", extra_headers=headers) as ws:
                await ws.send_message(messages.encode(Hello(node=victim, version="v1")))
                assert isinstance(messages.decode_downstream(await ws.get_message()), Welcome)
                route = Route("operations.kubeedge.io/v1alpha2", "imageprepulljob", "any-job", victim)
                await ws.send_message(
                    messages.encode(Report(route=route, job_uid="u", seq=1, action="Check", succ=True))
                )
                with pytest.raises(trio_websocket.ConnectionClosed), anyio.fail_after(20):
                    await _drain(ws)
            await eventually(lambda: victim not in hub.hub.sessions)
            await create_job(crds, "ImagePrePullJob", name, _prepull([good]))
            job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert [e.phase for e in job.status.node_status] == [NodeTaskPhase.SUCCESSFUL]
    assert metric(hub, "nodetaskd_hub_connection_errors_total", transport="websocket") == 1
    failures = [e for e in logs if e["event"] == "edge_connection_failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "error"


# ------------------------------------------------------------------------------ connection caps


async def test_connections_beyond_the_caps_are_refused_naming_the_setting(crds: ControlPlane) -> None:
    """Past maxHandshakes a connection gets 503 (once no place came free for a moment) before any websocket work;
    past maxSessions an edge gets 503."""
    first, second = unique("cap"), unique("cap")
    tokens = await register_edges(crds, [first, second])
    async with running_hub(crds, "hub-caps", max_handshakes=2, max_sessions=1, handshake_timeout=60) as hub:
        port = port_of(hub)
        idle = [await trio.open_tcp_stream(LOOPBACK, port) for _ in range(2)]
        await eventually(lambda: metric(hub, "nodetaskd_hub_handshakes") == 2)
        refused = await raw_exchange(port, b"")
        assert refused.startswith(b"HTTP/1.1 503 ")
        assert b"maxHandshakes" in refused
        assert metric(hub, "nodetaskd_hub_connections_refused_total", limit="maxHandshakes") == 1
        for stream in idle:
            await stream.aclose()
        await eventually(lambda: metric(hub, "nodetaskd_hub_handshakes") == 0)
        async with running_edges([light_edge(first, hub.url, tokens[first])]):
            status, body = await handshake(port, f"/nodes/{second}", tokens[second])
            assert (status, b"maxSessions" in body) == (503, True)
            assert metric(hub, "nodetaskd_hub_connections_refused_total", limit="maxSessions") == 1
        # The session's place comes back when it ends.
        await eventually(lambda: first not in hub.hub.sessions)
        async with running_edges([light_edge(second, hub.url, tokens[second])]):
            assert second in hub.hub.sessions


async def test_a_connection_waits_in_the_backlog_for_a_handshake_place_given_back_soon(
    crds: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every handshake place taken, a new connection is served once a place comes back, not refused."""
    monkeypatch.setattr(door, "HANDSHAKE_QUEUE_S", 60.0)  # so that a loaded machine cannot make the wait run out
    async with running_hub(crds, "hub-queue", max_handshakes=1, handshake_timeout=60) as hub:
        port = port_of(hub)
        holder = await trio.open_tcp_stream(LOOPBACK, port)
        await eventually(lambda: metric(hub, "nodetaskd_hub_handshakes") == 1)
        waiting = await trio.open_tcp_stream(LOOPBACK, port)  # connected: the kernel holds it until accepted
        async with waiting:
            await waiting.send_all(
                b"GET /elsewhere HTTP/1.1\r\nhost: hub\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
            )
            await holder.aclose()
            with anyio.fail_after(20):
                answer = await waiting.receive_some(65536)
    assert answer.startswith(b"HTTP/1.1 404 "), answer  # the request was read: it had a handshake place
    assert metric(hub, "nodetaskd_hub_connections_refused_total", limit="maxHandshakes") == 0


async def test_idle_connections_that_never_finish_their_handshake_or_hello_are_closed(crds: ControlPlane) -> None:
    """A silent connection is closed after handshakeTimeout, an authenticated one without Hello after helloTimeout."""
    node = unique("idle")
    tokens = await register_edges(crds, [node])
    async with running_hub(crds, "hub-idle", handshake_timeout=0.5, hello_timeout=0.5) as hub:
        assert await raw_exchange(port_of(hub), b"") == b""  # closed by the hub, not by the 20 s guard
        assert metric(hub, "nodetaskd_hub_handshake_timeouts_total") == 1
        half = b"GET /nodes/" + node.encode() + b" HTTP/1.1\r\nhost: hub\r\n"  # never finishes its headers
        assert await raw_exchange(port_of(hub), half) == b""
        assert metric(hub, "nodetaskd_hub_handshake_timeouts_total") == 2
        headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
        async with trio_websocket.open_websocket_url(f"{hub.url}/nodes/{node}", extra_headers=headers) as ws:
            with pytest.raises(trio_websocket.ConnectionClosed) as closed, anyio.fail_after(20):
                await ws.get_message()
        assert closed.value.reason is not None
        assert closed.value.reason.code == 1002
        await eventually(lambda: metric(hub, "nodetaskd_hub_handshakes") == 0)


# ---------------------------------------------------------------------------------- huge frames


async def test_megabyte_route_parts_are_refused_and_neither_cached_nor_logged_whole(crds: ControlPlane) -> None:
    """Reports whose route holds a 1 MB part get a short error; the route cache and the log do not grow with them."""
    node = unique("huge")
    tokens = await register_edges(crds, [node])
    headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
    before = parse_route.cache_info().currsize
    with capture_logs() as logs:
        async with (
            running_hub(crds, "hub-huge-routes") as hub,
            trio_websocket.open_websocket_url(f"{hub.url}/nodes/{node}", extra_headers=headers) as ws,
        ):
            await ws.send_message(messages.encode(Hello(node=node, version="v1")))
            assert isinstance(messages.decode_downstream(await ws.get_message()), Welcome)
            for i in range(100):
                part = f"g{i}" + "g" * 1_000_000
                report = {
                    "op": "report",
                    "route": f"{part}/v1alpha2/imageprepulljob/j/nodes/{node}",
                    "jobUid": "u",
                    "seq": i,
                    "action": "Check",
                    "succ": True,
                }
                await ws.send_message(msgspec.json.encode(report).decode())
                reply = messages.decode_downstream(await ws.get_message())
                assert isinstance(reply, Error)
                assert reply.code == "malformed"
                assert len(reply.message) < 1024
                if i % 10 == 0:  # and a ~1 MB error frame, logged once
                    await ws.send_message(messages.encode(Error(code="x" * 500_000, message="y" * 500_000)))
            await ws.send_message(messages.encode(Heartbeat(sent_at=1.0)))
            assert messages.decode_downstream(await ws.get_message()) == Heartbeat(sent_at=1.0)
    assert parse_route.cache_info().currsize == before
    assert metric(hub, "nodetaskd_hub_rejected_frames_total", reason="malformed") == 100
    longest = max(len(str(value)) for entry in logs for value in entry.values())
    assert longest < 1024
    assert any(entry["event"] == "frame_rejected" for entry in logs)
    assert any(entry["event"] == "edge_error" for entry in logs)
