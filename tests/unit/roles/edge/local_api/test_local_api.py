"""The device's local API over an in-memory cache: paths, documents, selection, refusals and watches."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs

import msgspec
import pytest
import structlog
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from roles.common.httpserver import Request, Response
from roles.edge.cache.view import Change, ChangeType, Listing, MemoryCache, Object
from roles.edge.local_api.answers import watch_event
from roles.edge.local_api.local_api import LOOPBACK, LocalApi, Serving, serve_local_api
from roles.edge.local_api.requests import watch_start

NODE = "edge-1"


def pod(name: str, *, ns: str = "ns", node: str = NODE, rv: int, labels: dict[str, str] | None = None) -> Object:
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv), "labels": labels or {}},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


def filled() -> MemoryCache:
    """A Node, Pods on it and on another node, a ConfigMap and a Secret."""
    cache = MemoryCache()
    cache.put("Node", {"metadata": {"name": NODE, "resourceVersion": "1"}})
    cache.put("Pod", pod("web-1", rv=2, labels={"app": "x"}))
    cache.put("Pod", pod("web-2", rv=3, labels={"app": "y"}))
    cache.put("Pod", pod("db-1", ns="other", rv=4, labels={"app": "x"}))
    cache.put("Pod", pod("far-1", node="edge-2", rv=5, labels={"app": "x"}))
    cache.put(
        "ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": "6"}, "data": {"k": "v"}}
    )
    cache.put("Secret", {"metadata": {"name": "key", "namespace": "ns", "resourceVersion": "7"}, "data": {"k": "dg=="}})
    return cache


def api_over(cache: MemoryCache, *, serve_secrets: bool = False) -> LocalApi:
    return LocalApi(cache, serve_secrets=serve_secrets, log=structlog.get_logger())


def request(path: str, query: str = "", *, method: str = "GET", host: str = "127.0.0.1:10261") -> Request:
    return Request(method=method, path=path, query=query, headers=(("host", host),), body=b"")


async def get(api: LocalApi, path: str, query: str = "", **kwargs: str) -> tuple[int, Any]:
    response = await api.handle(request(path, query, **kwargs))
    assert response.stream is None
    return response.status, msgspec.json.decode(response.body)


def names(body: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


# ------------------------------------------------------------------------------------------ documents


async def test_discovery_documents_describe_the_served_kinds() -> None:
    """/api, /api/v1, /apis and /version answer as kubectl's discovery expects, naming the four kinds."""
    api = api_over(filled())
    status, versions = await get(api, "/api")
    assert (status, versions["kind"], versions["versions"]) == (200, "APIVersions", ["v1"])
    _, resources = await get(api, "/api/v1")
    served = {r["name"]: r for r in resources["resources"]}
    assert set(served) == {"nodes", "pods", "configmaps", "secrets", "services"}
    assert served["pods"]["namespaced"]
    assert not served["nodes"]["namespaced"]
    assert all(r["verbs"] == ["get", "list", "watch"] for r in served.values())
    assert served["pods"]["shortNames"] == ["po"]
    assert (await get(api, "/apis"))[1] == {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    _, version = await get(api, "/version")
    assert (version["major"], version["minor"]) == ("1", "20")


# ---------------------------------------------------------------------------------------- get and list


async def test_objects_are_got_by_name_with_their_kind() -> None:
    """A Node and a namespaced Pod are answered whole, with kind and apiVersion set."""
    api = api_over(filled())
    status, node = await get(api, f"/api/v1/nodes/{NODE}")
    assert (status, node["kind"], node["apiVersion"], node["metadata"]["name"]) == (200, "Node", "v1", NODE)
    status, got = await get(api, "/api/v1/namespaces/ns/pods/web-1")
    assert (status, got["kind"], got["spec"]["nodeName"]) == (200, "Pod", NODE)
    status, conf = await get(api, "/api/v1/namespaces/ns/configmaps/conf")
    assert (status, conf["data"]) == (200, {"k": "v"})


async def test_an_object_not_cached_is_a_not_found_status() -> None:
    """A missing object is a Kubernetes NotFound Status, worded as the API server words it."""
    status, body = await get(api_over(filled()), "/api/v1/namespaces/ns/pods/gone")
    assert status == 404
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "gone" not found',
        "reason": "NotFound",
        "details": {"name": "gone", "kind": "pods"},
        "code": 404,
    }


@pytest.mark.parametrize(
    ("path", "query", "expected"),
    [
        ("/api/v1/pods", "", ["far-1", "web-1", "web-2", "db-1"]),
        ("/api/v1/namespaces/ns/pods", "", ["far-1", "web-1", "web-2"]),
        ("/api/v1/pods", f"fieldSelector=spec.nodeName%3D{NODE}", ["web-1", "web-2", "db-1"]),
        ("/api/v1/pods", f"fieldSelector=spec.nodeName%21%3D{NODE}", ["far-1"]),
        ("/api/v1/namespaces/ns/pods", "labelSelector=app%3Dx", ["far-1", "web-1"]),
        ("/api/v1/pods", "labelSelector=app+in+%28x%29&fieldSelector=metadata.namespace%3Dother", ["db-1"]),
        ("/api/v1/pods", "labelSelector=app+notin+%28x%29", ["web-2"]),
        ("/api/v1/pods", "labelSelector=%21app", []),
        ("/api/v1/namespaces/empty/pods", "", []),
        ("/api/v1/nodes", "fieldSelector=metadata.name%3Dedge-1", [NODE]),
        ("/api/v1/configmaps", "", ["conf"]),
    ],
)
async def test_lists_select_by_namespace_labels_and_fields(path: str, query: str, expected: list[str]) -> None:
    """A list holds exactly the objects its namespace and selectors select, ordered by namespace and name."""
    status, body = await get(api_over(filled()), path, query)
    assert (status, names(body)) == (200, expected)


async def test_a_list_carries_the_kind_and_the_caches_resource_version() -> None:
    """A list is a ``<Kind>List`` at the resource version the cache is current at."""
    _, body = await get(api_over(filled()), "/api/v1/pods")
    assert (body["kind"], body["apiVersion"], body["metadata"]) == ("PodList", "v1", {"resourceVersion": "5"})


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("labelSelector=a+b", "unable to parse requirement: found 'b', expected: '=', '!=', '==', 'in', notin'"),
        ("fieldSelector=foo%3Dbar", "field label not supported: foo"),
        (
            "labelSelector=a+b&fieldSelector=foo",
            "unable to parse requirement: found 'b', expected: '=', '!=', '==', 'in', notin'",
        ),
    ],
)
async def test_a_bad_selector_is_a_bad_request_with_kubernetes_message(query: str, message: str) -> None:
    """A selector the API server refuses is refused with its message; the label selector is read first."""
    status, body = await get(api_over(filled()), "/api/v1/pods", query)
    assert (status, body["reason"], body["message"]) == (400, "BadRequest", message)


# ------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("method", "path", "named"),
    [
        ("DELETE", "/api/v1/namespaces/ns/pods/web-1", 'pods "web-1"'),
        ("POST", "/api/v1/namespaces/ns/pods", "pods"),
        ("PUT", "/api/v1/namespaces/ns/configmaps/conf", 'configmaps "conf"'),
        ("PATCH", f"/api/v1/nodes/{NODE}", f'nodes "{NODE}"'),
        ("DELETE", "/api/v1/namespaces/ns/secrets", "secrets"),
        ("POST", "/apis/apps/v1/namespaces/ns/deployments", "/apis/apps/v1/namespaces/ns/deployments"),
    ],
)
async def test_writes_are_forbidden_naming_why(method: str, path: str, named: str) -> None:
    """Every write is a 403 Forbidden Status that says this is a read-only copy of the cloud's objects."""
    status, body = await get(api_over(filled()), path, method=method)
    assert (status, body["reason"], body["code"]) == (403, "Forbidden", 403)
    assert body["message"] == (
        f"{named} is forbidden: this is the device's read-only copy of cloud objects (its local API);"
        " write through the cloud's API server"
    )


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/endpoints",
        "/api/v1/namespaces",
        "/api/v1/namespaces/ns",
        f"/api/v1/nodes/{NODE}/status",
        "/api/v1/namespaces/ns/nodes",
        "/api/v1/pods/web-1",
        "/api/v1/namespaces/ns/pods/web-1/log",
        "/api/v2/pods",
        "/apis/apps/v1",
        "/healthz",
        "/",
    ],
)
async def test_paths_of_nothing_served_are_not_found_statuses(path: str) -> None:
    """Another kind, a subresource or a path of the wrong scope is a NotFound Status."""
    status, body = await get(api_over(filled()), path)
    assert (status, body["kind"], body["reason"]) == (404, "Status", "NotFound")


async def test_secrets_are_served_only_when_the_config_allows_it() -> None:
    """Without ``serveSecrets`` a Secret, or a list of them, is refused naming the setting; with it, served."""
    status, body = await get(api_over(filled()), "/api/v1/namespaces/ns/secrets/key")
    assert (status, body["reason"]) == (403, "Forbidden")
    assert "localApi.serveSecrets" in body["message"]
    status, body = await get(api_over(filled()), "/api/v1/secrets")
    assert status == 403
    status, body = await get(api_over(filled(), serve_secrets=True), "/api/v1/namespaces/ns/secrets/key")
    assert (status, body["data"]) == (200, {"k": "dg=="})


@pytest.mark.parametrize("host", ["evil.example:10261", "10.0.0.1:10261", "127.0.0.1.nip.io"])
async def test_requests_addressed_to_other_hosts_are_refused(host: str) -> None:
    """A request naming a non-loopback host (as a DNS-rebinding web page's would) is refused."""
    status, body = await get(api_over(filled()), "/api/v1/pods", host=host)
    assert (status, body["reason"]) == (403, "Forbidden")


@pytest.mark.parametrize("host", ["127.0.0.1:10261", "localhost", "LOCALHOST:1", "[::1]:10261", "[::1]"])
async def test_requests_addressed_to_loopback_are_answered(host: str) -> None:
    """127.0.0.1, localhost and [::1], with or without a port, are this device."""
    assert (await get(api_over(filled()), "/api/v1/pods", host=host))[0] == 200


async def test_an_unsupported_method_is_refused() -> None:
    """A method that neither reads nor writes is a MethodNotAllowed Status."""
    status, body = await get(api_over(filled()), "/api/v1/pods", method="OPTIONS")
    assert (status, body["reason"]) == (405, "MethodNotAllowed")


# --------------------------------------------------------------------------------------------- watches


class Watch:
    """The events of one streamed watch, as a client reads them."""

    def __init__(self, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self._receive = receive

    async def next(self) -> dict[str, Any]:
        event: dict[str, Any] = msgspec.json.decode(await self._receive.receive())
        return event

    async def ended(self) -> bool:
        """Whether the stream is over (after any events still unread are skipped)."""
        try:
            while True:
                await self._receive.receive()
        except trio.EndOfChannel:
            return True


@asynccontextmanager
async def watching(api: LocalApi, path: str, query: str = "") -> AsyncIterator[Watch]:
    response = await api.handle(request(path, query))
    assert response.status == 200
    assert response.stream is not None
    stream = response.stream
    send, receive = trio.open_memory_channel[bytes](100)

    async def run() -> None:
        async with send:
            await stream(send.send)

    with trio.fail_after(10):  # a guard: a watch that never ends fails the test instead of hanging it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.testing.wait_all_tasks_blocked()  # listed and subscribed
            yield Watch(receive)
            nursery.cancel_scope.cancel()


def summary(event: dict[str, Any]) -> tuple[str, str]:
    return event["type"], event["object"]["metadata"]["name"]


@pytest.mark.parametrize("since", ["", "resourceVersion=0"])
async def test_a_watch_from_nothing_starts_with_the_current_objects(since: str) -> None:
    """Without a resource version to start at, a watch first sends every selected object as ADDED."""
    async with watching(api_over(filled()), "/api/v1/namespaces/ns/pods", f"watch=1&{since}") as watch:
        first = [await watch.next() for _ in range(3)]
    assert [summary(e) for e in first] == [("ADDED", "far-1"), ("ADDED", "web-1"), ("ADDED", "web-2")]
    assert first[0]["object"]["kind"] == "Pod"
    assert first[0]["object"]["apiVersion"] == "v1"


async def test_a_watch_from_the_listed_version_sees_the_later_changes_in_order() -> None:
    """A watch started at a list's resource version sees each later change of its kind and namespace."""
    cache = filled()
    async with watching(api_over(cache), "/api/v1/namespaces/ns/pods", "watch=true&resourceVersion=5") as watch:
        cache.put("Pod", pod("web-3", rv=10))
        cache.put("Pod", pod("db-2", ns="other", rv=11))  # another namespace
        cache.put("ConfigMap", {"metadata": {"name": "c2", "namespace": "ns", "resourceVersion": "12"}})
        cache.put("Pod", pod("web-3", rv=13, labels={"v": "2"}))
        cache.delete("Pod", pod("web-1", rv=14))
        seen = [await watch.next() for _ in range(3)]
    assert [summary(e) for e in seen] == [("ADDED", "web-3"), ("MODIFIED", "web-3"), ("DELETED", "web-1")]
    assert seen[1]["object"]["metadata"]["labels"] == {"v": "2"}


@pytest.mark.parametrize(
    ("since", "message"), [("3", "too old resource version: 3 (5)"), ("9", "too large resource version: 9, current: 5")]
)
async def test_a_watch_from_another_version_is_told_to_list_again(since: str, message: str) -> None:
    """A watch asked to start where the cache is not gets the API server's 410 Expired event, then ends."""
    async with watching(api_over(filled()), "/api/v1/pods", f"watch=1&resourceVersion={since}") as watch:
        event = await watch.next()
        assert await watch.ended()
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"], event["object"]["message"]) == (410, "Expired", message)


async def test_objects_moving_in_and_out_of_a_selection_are_added_and_deleted_for_the_watch() -> None:
    """A Pod relabelled into a watch's selection is ADDED for it, relabelled out DELETED, outside unseen."""
    cache = filled()
    async with watching(api_over(cache), "/api/v1/pods", "watch=1&resourceVersion=5&labelSelector=app%3Dx") as watch:
        cache.put("Pod", pod("web-2", rv=10, labels={"app": "x"}))  # in
        cache.put("Pod", pod("web-2", rv=11, labels={"app": "x", "v": "2"}))  # stays in
        cache.put("Pod", pod("web-1", rv=12, labels={"app": "z"}))  # out
        cache.put("Pod", pod("web-1", rv=13, labels={"app": "w"}))  # stays out: unseen
        cache.put("Pod", pod("web-9", rv=14, labels={"app": "x"}))
        seen = [summary(await watch.next()) for _ in range(4)]
    assert seen == [("ADDED", "web-2"), ("MODIFIED", "web-2"), ("DELETED", "web-1"), ("ADDED", "web-9")]


@given(st.booleans(), st.booleans(), st.sampled_from(ChangeType))
def test_a_watch_sees_a_change_by_where_the_object_was_and_is(before: bool, after: bool, kind: ChangeType) -> None:
    """Which event a change is for a selecting watch depends only on whether the object was and is selected."""
    old: Object = {"metadata": {"name": "p", "labels": {"in": str(before)}}}
    new: Object = {"metadata": {"name": "p", "labels": {"in": str(after)}}}
    change = Change(kind, new, old if kind is ChangeType.MODIFIED else None)
    event = watch_event(change, lambda obj: obj["metadata"]["labels"]["in"] == "True")
    expected: ChangeType | None
    if kind is not ChangeType.MODIFIED:
        expected = kind if after else None
    else:
        expected = {
            (True, True): ChangeType.MODIFIED,
            (False, True): ChangeType.ADDED,
            (True, False): ChangeType.DELETED,
            (False, False): None,
        }[(before, after)]
    assert (event[0] if event else None) == expected
    assert event is None or event[1] is new


async def test_end_watches_ends_the_running_watches_only() -> None:
    """Ending the watches (the cloud came back) ends those running; one started after streams on."""
    cache = filled()
    api = api_over(cache)
    async with watching(api, "/api/v1/pods", "watch=1&resourceVersion=5") as first:
        assert api.watches == 1
        assert api.end_watches() == 1
        assert await first.ended()
        async with watching(api, "/api/v1/pods", "watch=1&resourceVersion=5") as second:
            cache.put("Pod", pod("web-3", rv=10))
            assert summary(await second.next()) == ("ADDED", "web-3")
    assert api.watches == 0


async def test_a_watch_ends_at_its_timeout(autojump_clock: trio.testing.MockClock) -> None:
    """``timeoutSeconds`` ends a quiet watch after that long, as the API server does."""
    start = trio.current_time()
    async with watching(api_over(filled()), "/api/v1/pods", "watch=1&resourceVersion=5&timeoutSeconds=7") as watch:
        assert await watch.ended()
    assert trio.current_time() - start == 7


async def test_a_watch_the_cache_drops_for_lagging_ends() -> None:
    """A watch whose client reads too slowly is ended (not left to miss changes) once the cache drops it."""
    cache = MemoryCache(subscriber_buffer=2)
    cache.put("Pod", pod("web-1", rv=1))
    api = api_over(cache)
    response = await api.handle(request("/api/v1/pods", "watch=1&resourceVersion=1"))
    assert response.stream is not None
    stream = response.stream
    sent: list[bytes] = []
    gate = trio.Event()

    async def slow_send(piece: bytes) -> None:
        sent.append(piece)
        await gate.wait()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream, slow_send)
            await trio.testing.wait_all_tasks_blocked()
            for rv in range(2, 7):  # one in flight, two buffered, then the buffer overflows
                cache.put("Pod", pod(f"p{rv}", rv=rv))
            gate.set()
    assert len(sent) == 3
    assert api.watches == 0


async def test_changes_already_listed_are_not_sent_again() -> None:
    """A change the watch's listing already holds (made while it listed) is not sent as an event."""

    class SlowList:
        """A cache whose listing takes a while, during which the cache changes."""

        def __init__(self, cache: MemoryCache) -> None:
            self.cache = cache
            self.get = cache.get
            self.subscribe = cache.subscribe

        async def list(self, kind: str, namespace: str) -> Listing:
            self.cache.put("Pod", pod("during", rv=10))
            await trio.lowlevel.checkpoint()
            return await self.cache.list(kind, namespace)

    cache = filled()
    api = LocalApi(SlowList(cache), serve_secrets=False, log=structlog.get_logger())
    async with watching(api, "/api/v1/pods", "watch=1") as watch:
        cache.put("Pod", pod("after", rv=11))
        seen = [summary(await watch.next()) for _ in range(6)]
    assert seen.count(("ADDED", "during")) == 1
    assert seen[-1] == ("ADDED", "after")


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/api/v1/namespaces/ns/pods/web-1", "watch=true&resourceVersion=5"),
        ("/api/v1/watch/namespaces/ns/pods/web-1", "resourceVersion=5"),
    ],
)
async def test_a_watch_of_one_object_sees_only_it(path: str, query: str) -> None:
    """A watch on an object's path (also the legacy /watch/ one) sees that object's changes only."""
    cache = filled()
    async with watching(api_over(cache), path, query) as watch:
        cache.put("Pod", pod("web-2", rv=10, labels={"v": "2"}))
        cache.put("Pod", pod("web-1", rv=11, labels={"v": "2"}))
        assert summary(await watch.next()) == ("MODIFIED", "web-1")


@pytest.mark.parametrize(
    "query", ["watch=1&resourceVersion=abc", "watch=1&timeoutSeconds=soon", "watch=1&fieldSelector=x"]
)
async def test_bad_watch_parameters_are_refused_before_streaming(query: str) -> None:
    """A watch that cannot be served as asked is a 400 Status, not a stream."""
    status, body = await get(api_over(filled()), "/api/v1/pods", query)
    assert (status, body["reason"]) == (400, "BadRequest")


async def test_response_to_a_watch_is_a_json_stream() -> None:
    """A watch is answered 200 with a streamed JSON body."""
    response: Response = await api_over(filled()).handle(request("/api/v1/pods", "watch=1"))
    assert (response.status, response.content_type, response.body) == (200, "application/json", b"")


# ------------------------------------------------------------------------ over sockets: what a client costs


def _socket_as(uid: int) -> socket.socket:
    """A TCP socket owned by ``uid`` (the kernel records who created it; connecting stays with this process)."""
    os.seteuid(uid)
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    finally:
        os.seteuid(0)


async def _connect(port: int, *, uid: int | None = None) -> trio.SocketStream:
    if uid is None:
        return await trio.open_tcp_stream(LOOPBACK, port)
    sock = trio.socket.from_stdlib_socket(_socket_as(uid))
    await sock.connect((LOOPBACK, port))
    return trio.SocketStream(sock)


async def _answer(stream: trio.SocketStream) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the one response on ``stream``, read until the server ends it; then closed."""
    data = b""
    async with stream:
        while chunk := await stream.receive_some():
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), msgspec.json.decode(body)


async def _get_over(stream: trio.SocketStream, target: str) -> tuple[int, dict[str, Any]]:
    await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    return await _answer(stream)


@asynccontextmanager
async def _serving(**options: Any) -> AsyncIterator[Serving]:
    async with trio.open_nursery() as nursery:
        serve = functools.partial(serve_local_api, filled(), port=0, log=structlog.get_logger(), **options)
        yield await nursery.start(serve)
        nursery.cancel_scope.cancel()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="opening a socket as another user needs root")


@needs_root
async def test_one_user_holding_connections_leaves_places_for_another_users_client() -> None:
    """A process opening 100 connections that never finish a request holds 25 (its share) and is told 503
    for the rest, naming localApi.maxConnectionsPerClient; a client of another user is still answered."""
    async with _serving() as serving, trio.open_nursery() as nursery:
        refused: list[tuple[int, dict[str, Any]]] = []
        all_told = trio.Event()

        async def hold(stream: trio.SocketStream) -> None:
            await stream.send_all(b"GET /version HTTP/1.1\r\nHost: 127.0.0")  # a head begun, never finished
            answer = await _answer(stream)
            refused.append(answer)
            if len(refused) == 75:
                all_told.set()

        held = [await _connect(serving.port) for _ in range(100)]
        for stream in held:
            nursery.start_soon(hold, stream)
        with trio.fail_after(30):
            await all_told.wait()
            other = await _connect(serving.port, uid=65534)
            status, version = await _get_over(other, "/version")
        assert (status, version["gitVersion"]) == (200, "v1.20.2+nodetaskd-local")
        assert len(refused) == 75  # the 25 admitted are still waiting for the rest of their heads
        status, body = refused[0]
        assert (status, body["reason"]) == (503, "ServiceUnavailable")
        assert body["message"] == (
            "the local API holds its limit of 25 connections from one client (uid 0):"
            " close some, or raise localApi.maxConnectionsPerClient"
        )
        nursery.cancel_scope.cancel()


@needs_root
async def test_a_connection_past_the_total_is_told_503_naming_the_setting() -> None:
    """Past localApi.maxConnections a client is refused at accept, even one holding none, with a Status that
    says which limit."""
    async with _serving(max_connections=2, max_connections_per_client=1) as serving:
        first, second = await _connect(serving.port), await _connect(serving.port, uid=65534)
        with trio.fail_after(30):
            for held in (first, second):  # answered, so admitted, and kept alive
                await held.send_all(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert (await held.receive_some()).startswith(b"HTTP/1.1 200 ")
            status, body = await _answer(await _connect(serving.port, uid=65533))
        assert (status, body["message"]) == (
            503,
            "the local API holds its limit of 2 connections: raise localApi.maxConnections",
        )
        await first.aclose()
        await second.aclose()


async def test_a_connection_dripping_its_request_head_is_closed_at_the_header_timeout() -> None:
    """A head sent a byte at a time never completes the request: the connection is closed, its place freed."""
    async with _serving(header_timeout=0.5, max_connections=1, max_connections_per_client=1) as serving:
        dripping = await _connect(serving.port)
        await dripping.send_all(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with trio.fail_after(30):
            with contextlib.suppress(trio.BrokenResourceError):
                while True:
                    await dripping.send_all(b"X")
                    with trio.move_on_after(0.1):
                        if await dripping.receive_some() == b"":
                            break
            status, _ = await _get_over(await _connect(serving.port), "/version")  # its place is free again
        assert status == 200


@pytest.mark.parametrize(
    ("query", "named"),
    [
        (f"watch=1&timeoutSeconds={'9' * 309}", "timeoutSeconds '99999"),
        ("watch=1&timeoutSeconds=soon", "timeoutSeconds 'soon' is not a number of seconds"),
        ("watch=1&timeoutSeconds=1_000", "timeoutSeconds '1_000'"),
        (f"watch=1&resourceVersion={'9' * 5000}", "resourceVersion '99999"),
        ("watch=1&resourceVersion=18446744073709551616", "resourceVersion '18446744073709551616'"),
        (f"limit={'9' * 309}", "limit '99999"),
        (f"watch=1&limit={'9' * 5000}", "limit '99999"),
        (f"labelSelector=a%3E{'9' * 5000}", "for 'Gt', 'Lt' operators, the value must be an integer"),
    ],
)
async def test_numeric_query_parameters_too_long_or_malformed_are_a_400_naming_them(query: str, named: str) -> None:
    """However many digits, a number the API server would refuse is a 400 Status naming the parameter, never a
    500 with a traceback per request; the value is quoted clipped."""
    with capture_logs() as logs, trio.fail_after(30):  # a watch that was let through would stream on
        async with _serving() as serving:
            status, body = await _get_over(await _connect(serving.port), f"/api/v1/pods?{query}")
    assert (status, body["reason"]) == (400, "BadRequest")
    assert named in body["message"]
    assert len(body["message"]) < 300
    assert [e for e in logs if e["log_level"] in ("error", "critical")] == []


@pytest.mark.parametrize(("query", "since"), [("resourceVersion=00", None), ("resourceVersion=0007", 7)])
def test_a_resource_version_is_read_as_the_api_server_reads_it(query: str, since: int | None) -> None:
    """Leading zeros are allowed (as by ParseUint): ``00`` is ``0``, the current objects first."""
    assert watch_start(parse_qs(query)) == since
