"""Hypothesis against a live hub over real sockets: no handshake and no frame stops it serving well-behaved edges.

The hub runs in the test's trio loop; hypothesis drives the examples from a worker thread, and each
example hops back into the loop to talk to the hub. After every example a probe edge must still
be welcomed and get its heartbeat echoed; at the end a job on another edge must complete, and no
connection may have ended in an unexpected error.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
import trio
import trio_websocket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodetask import messages
from nodetask.messages import Heartbeat, Hello, Welcome
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import IMAGE_PRE_PULL_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import RunningHub, light_edge, running_controller, running_edges, running_hub
from tests.integration.objects import create_job, job_when, unique

pytestmark = [pytest.mark.integration, pytest.mark.slow(75)]
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
LOOPBACK = "127.0.0.1"
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


def handshakes(node: str, token: str) -> st.SearchStrategy[bytes]:
    """Upgrade requests: some well-formed for ``node``, most wrong in their path, headers, token or framing."""
    pieces = [node, "nodes", "..", ".", "/", "#", "?", "%2F", "%00", "%", "x", "-", "A", " ", "\t", "é", "\\", ";"]
    tricks = [node, "x", "/..", "/../../..", "/healthz", "/version", "/default/secrets/x", "#x", "?x=1"]
    paths = st.one_of(
        st.lists(st.sampled_from(pieces), max_size=8).map(lambda parts: "/nodes/" + "".join(parts)),
        st.lists(st.sampled_from(tricks), max_size=8).map(lambda parts: "/nodes/" + "".join(parts)),
        st.text(max_size=40).map(lambda text: "/" + text),
        st.just(f"/nodes/{node}"),
    )
    required = {
        "host": "hub",
        "upgrade": "websocket",
        "connection": "Upgrade",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version": "13",
    }
    auths = st.one_of(
        st.sampled_from([f"Bearer {token}", "Bearer wrong", None, "Bearer ", "Basic eDp5"]), st.text(max_size=30)
    )
    extra = st.lists(st.tuples(st.binary(min_size=1, max_size=20), st.binary(max_size=60)), max_size=4)

    @st.composite
    def request(draw: st.DrawFn) -> bytes:
        method = draw(st.sampled_from(["GET", "GET", "GET", "POST", "get", ""]))
        version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2", ""]))
        dropped = draw(st.one_of(st.just(set[str]()), st.sets(st.sampled_from(sorted(required)))))
        headers = [(k, v) for k, v in required.items() if k not in dropped]
        auth = draw(auths)
        if auth is not None:
            headers.append(("authorization", auth))
        head = f"{method} {draw(paths)} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
        data = head.encode("utf-8", "surrogatepass")
        data += b"".join(name + b": " + value + b"\r\n" for name, value in draw(extra))
        return data + draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"", b"\n"])) + draw(st.binary(max_size=40))

    return request()


def frames(node: str) -> st.SearchStrategy[str | bytes]:
    """Frames an authenticated edge might send: garbage, JSON, and message-shaped objects with wrong fields."""
    routes = st.builds(
        lambda kind, job, who: f"operations.kubeedge.io/v1alpha2/{kind}/{job}/nodes/{who}",
        st.sampled_from(["imageprepulljob", "nodeupgradejob", "x", ""]),
        st.sampled_from(["job", "", "..", "a" * 300]),
        st.sampled_from([node, "other", "", "..", node.upper()]),
    )
    message_like = st.fixed_dictionaries(
        {"op": st.sampled_from(["hello", "report", "heartbeat", "ack", "error", "welcome", "run_action", "x"])},
        optional={
            "node": st.sampled_from([node, "other", ""]) | st.text(max_size=10),
            "version": st.text(max_size=20) | json_values,
            "capabilities": json_values,
            "route": routes | json_values,
            "jobUid": st.text(max_size=10),
            "seq": st.integers() | json_values,
            "action": st.sampled_from(["Check", "Pull", ""]) | st.text(max_size=10),
            "succ": st.booleans() | json_values,
            "id": st.text(max_size=10),
            "code": st.text(max_size=10),
            "message": st.text(max_size=50),
            "ref": json_values,
            "sentAt": st.floats() | json_values,
        },
    )
    return st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200),
        message_like.map(json.dumps),
        json_values.map(json.dumps),
    )


async def handshake_example(port: int, request: bytes) -> None:
    """Send one upgrade request; read until the hub has answered its headers or closed the connection."""
    stream = await trio.open_tcp_stream(LOOPBACK, port)
    async with stream:
        with anyio.fail_after(10):
            try:
                await stream.send_all(request)
                received = b""
                while b"\r\n\r\n" not in received and (chunk := await stream.receive_some(4096)):
                    received += chunk
            except trio.BrokenResourceError:
                return  # closed by the hub while we sent


async def frames_example(hub: RunningHub, node: str, token: str, hello_first: bool, sent: list[str | bytes]) -> None:
    """An authenticated session that sends ``sent`` (after a Hello, or not) and leaves."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    with anyio.fail_after(20):
        async with trio_websocket.open_websocket_url(f"{hub.url}/nodes/{node}", extra_headers=headers) as ws:
            try:
                if hello_first:
                    await ws.send_message(messages.encode(Hello(node=node, version="v1")))
                for frame in sent:
                    await ws.send_message(frame)
            except trio_websocket.ConnectionClosed:
                return


async def probe(hub: RunningHub, node: str, token: str) -> None:
    """A well-behaved edge is welcomed and its heartbeat echoed: the hub still serves."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    with anyio.fail_after(20):
        async with trio_websocket.open_websocket_url(f"{hub.url}/nodes/{node}", extra_headers=headers) as ws:
            await ws.send_message(messages.encode(Hello(node=node, version="v1")))
            assert isinstance(messages.decode_downstream(await ws.get_message()), Welcome)
            await ws.send_message(messages.encode(Heartbeat(sent_at=7.0)))
            assert messages.decode_downstream(await ws.get_message()) == Heartbeat(sent_at=7.0)


def metric(hub: RunningHub, name: str, **labels: str) -> float:
    return hub.registry.get_sample_value(name, labels) or 0.0


async def test_fuzzed_handshakes_and_frames_never_stop_the_hub(crds: ControlPlane, cloud_kube: Kube) -> None:
    """Whatever arrives at the door or in a session, the hub stays up, a probe is served and a job completes."""
    fuzzer, prober, worker = unique("fuzz"), unique("probe"), unique("work")
    tokens = await register_edges(crds, [fuzzer, prober, worker])
    name = unique("fuzzed")
    async with (
        running_controller(crds),
        running_hub(crds, "hub-fuzz", handshake_timeout=0.3, hello_timeout=0.3) as hub,
        running_edges([light_edge(worker, hub.url, tokens[worker])]),
    ):
        port = int(hub.url.rsplit(":", 1)[1])

        def fuzz() -> None:
            # Runs in a worker thread; each example runs in the test's loop, where the hub is.
            @FUZZ
            @given(handshakes(fuzzer, tokens[fuzzer]))
            def at_the_door(request: bytes) -> None:
                anyio.from_thread.run(handshake_example, port, request)
                anyio.from_thread.run(probe, hub, prober, tokens[prober])

            @FUZZ
            @given(st.booleans(), st.lists(frames(fuzzer), max_size=6))
            def in_a_session(hello_first: bool, sent: list[Any]) -> None:
                anyio.from_thread.run(frames_example, hub, fuzzer, tokens[fuzzer], hello_first, sent)
                anyio.from_thread.run(probe, hub, prober, tokens[prober])

            at_the_door()
            in_a_session()

        await anyio.to_thread.run_sync(fuzz)
        await create_job(
            crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"nodeNames": [worker], "images": ["r.local/a:1"]}}
        )
        job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert [e.phase for e in job.status.node_status] == [NodeTaskPhase.SUCCESSFUL]
    assert metric(hub, "nodetaskd_hub_connection_errors_total", transport="websocket") == 0
