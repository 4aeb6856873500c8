"""The device's local API with real clients: kubectl against it, and the real API server beside it.

kubectl is the one the integration suite provisions (``control_plane.binaries.kubectl``, installed by
``tools.provision.controlplane`` when missing), run against a local API served from an in-memory
cache. The pinned kube-apiserver is the reference for selectors: the same requests get the same
refusals, and the same selectors select the same Pods, from it and from the local API.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
import structlog
import trio
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodetask.field_selectors import FieldRequirement
from nodetask.label_selectors import Operator, format_label_selector, new_requirement
from roles.common.httpserver import Request
from roles.edge.cache.view import MemoryCache, Object
from roles.edge.local_api.local_api import LocalApi, Serving, serve_local_api
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import unique
from tests.unit.nodetask.selector_cases import ACCEPTED_FIELDS, FIELD_ERRORS, LABEL_ERRORS

pytestmark = pytest.mark.integration
NODE = "edge-1"


def pod(name: str, *, ns: str = "ns", node: str = NODE, rv: int, labels: dict[str, str] | None = None) -> Object:
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv), "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }


@dataclass
class Device:
    """A local API serving a cache, and how to run kubectl against it."""

    cache: MemoryCache
    serving: Serving
    kubectl_path: Path
    home: Path

    def argv(self, *args: str) -> list[str]:
        port = self.serving.port
        return [str(self.kubectl_path), f"--server=http://127.0.0.1:{port}", f"--cache-dir={self.home}/cache", *args]

    async def kubectl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(60):
            return await trio.run_process(
                self.argv(*args), capture_stdout=True, capture_stderr=True, check=False, env=self.env()
            )

    def env(self) -> dict[str, str]:
        # No kubeconfig of the machine's may point kubectl elsewhere or add credentials.
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "KUBECONFIG": str(self.home / "none")}


@pytest.fixture
async def device(control_plane: ControlPlane, nursery: trio.Nursery, tmp_path: Path) -> Device:
    """A local API on a free loopback port over a cache holding a Node, Pods on it and on another node,
    a ConfigMap and a Secret."""
    cache = MemoryCache()
    cache.put("Node", {"metadata": {"name": NODE, "resourceVersion": "1"}, "spec": {}})
    cache.put("Pod", pod("web-1", rv=2, labels={"app": "x"}))
    cache.put("Pod", pod("web-2", rv=3, labels={"app": "y"}))
    cache.put("Pod", pod("db-1", ns="other", rv=4, labels={"app": "x"}))
    cache.put("Pod", pod("far-1", ns="other", node="edge-2", rv=5, labels={"app": "x"}))
    cache.put(
        "ConfigMap", {"metadata": {"name": "conf", "namespace": "ns", "resourceVersion": "6"}, "data": {"k": "v"}}
    )
    cache.put("Secret", {"metadata": {"name": "key", "namespace": "ns", "resourceVersion": "7"}, "data": {"k": "dg=="}})
    serving: Serving = await nursery.start(
        functools.partial(serve_local_api, cache, port=0, log=structlog.get_logger())
    )
    return Device(cache=cache, serving=serving, kubectl_path=control_plane.binaries.kubectl, home=tmp_path)


def table(out: bytes) -> list[list[str]]:
    """kubectl's table output as rows of cells, header first."""
    return [line.split() for line in out.decode().splitlines()]


async def test_kubectl_gets_the_node(device: Device) -> None:
    """``kubectl get node`` lists the cached Node."""
    result = await device.kubectl("get", "node")
    assert result.returncode == 0, result.stderr
    assert [row[0] for row in table(result.stdout)] == ["NAME", NODE]


async def test_kubectl_lists_the_nodes_pods_by_field_selector(device: Device) -> None:
    """``get pods -A --field-selector spec.nodeName=<node>`` lists the Pods bound to the node, in all namespaces."""
    result = await device.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={NODE}")
    assert result.returncode == 0, result.stderr
    assert [row[:2] for row in table(result.stdout)] == [
        ["NAMESPACE", "NAME"],
        ["ns", "web-1"],
        ["ns", "web-2"],
        ["other", "db-1"],
    ]


async def test_kubectl_lists_pods_by_label_in_a_namespace(device: Device) -> None:
    """``get pods -l app=x -n ns`` lists that namespace's Pods with the label only."""
    result = await device.kubectl("get", "pods", "-l", "app=x", "-n", "ns")
    assert result.returncode == 0, result.stderr
    assert [row[0] for row in table(result.stdout)] == ["NAME", "web-1"]


async def test_kubectl_reads_a_configmap_as_yaml(device: Device) -> None:
    """``get configmap -n ns conf -o yaml`` prints the cached ConfigMap whole."""
    result = await device.kubectl("get", "configmap", "-n", "ns", "conf", "-o", "yaml")
    assert result.returncode == 0, result.stderr
    got = yaml.safe_load(result.stdout)
    assert (got["kind"], got["apiVersion"], got["metadata"]["name"], got["data"]) == (
        "ConfigMap",
        "v1",
        "conf",
        {"k": "v"},
    )


async def test_kubectl_delete_is_refused_with_the_reason(device: Device) -> None:
    """``kubectl delete pod`` fails with the local API's 403, which says the API is a read-only copy."""
    result = await device.kubectl("delete", "pod", "-n", "ns", "web-1")
    assert result.returncode != 0
    assert result.stderr.decode().strip() == (
        'Error from server (Forbidden): pods "web-1" is forbidden: this is the device\'s read-only copy of cloud'
        " objects (its local API); write through the cloud's API server"
    )
    assert await device.cache.get("Pod", "ns", "web-1") is not None


async def test_kubectl_watch_sees_a_change_and_ends_when_the_watches_end(device: Device) -> None:
    """``kubectl get pods -w`` shows the Pods, then a Pod added to the cache, and exits when the API ends
    its watches (as when the cloud comes back)."""
    seen = b""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            # run_process owns the child: a failing test kills it instead of leaving it behind.
            process: trio.Process = await nursery.start(
                functools.partial(
                    trio.run_process,
                    device.argv("get", "pods", "-n", "ns", "-w"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=device.env(),
                )
            )
            assert process.stdout is not None
            while b"web-2" not in seen:
                seen += await process.stdout.receive_some()
            # kubectl lists, then watches from the list's version; the change must come after that.
            while device.serving.api.watches == 0:  # noqa: ASYNC110 - a counter of the API's, no event to wait on
                await trio.sleep(0.01)
            device.cache.put("Pod", pod("web-3", rv=10))
            while b"web-3" not in seen:
                seen += await process.stdout.receive_some()
            assert device.serving.api.end_watches() == 1
            assert await process.wait() == 0
    assert [row[0] for row in table(seen)] == ["NAME", "web-1", "web-2", "web-3"]


async def test_the_local_api_listens_on_loopback_only(device: Device) -> None:
    """The listening socket is bound to 127.0.0.1, never to every address."""
    listening = [
        c.laddr
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == device.serving.port
    ]
    assert [addr.ip for addr in listening] == ["127.0.0.1"]


def _socket_as(uid: int) -> socket.socket:
    """A TCP socket owned by ``uid`` (the kernel records who created it; connecting stays with this process)."""
    os.seteuid(uid)
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    finally:
        os.seteuid(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="opening a socket as another user needs root")
async def test_kubectl_is_answered_while_another_user_holds_every_connection_it_may(device: Device) -> None:
    """A process of another user opening 100 watches (each holds its connection for as long as it streams)
    gets 25 of them, the rest are told 503 naming localApi.maxConnectionsPerClient, and kubectl, run by
    root, still gets the Node."""
    told: list[bytes] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            all_told = trio.Event()

            async def hold() -> None:
                sock = trio.socket.from_stdlib_socket(_socket_as(65534))
                await sock.connect(("127.0.0.1", device.serving.port))
                async with trio.SocketStream(sock) as stream:
                    await stream.send_all(b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    answer = await stream.receive_some()
                    if answer.startswith(b"HTTP/1.1 200 "):
                        await trio.sleep_forever()  # watching, until the test ends
                    while chunk := await stream.receive_some():
                        answer += chunk
                told.append(answer)
                if len(told) == 75:
                    all_told.set()

            for _ in range(100):
                nursery.start_soon(hold)
            await all_told.wait()
            result = await device.kubectl("get", "node")
            assert result.returncode == 0, result.stderr
            assert [row[0] for row in table(result.stdout)] == ["NAME", NODE]
            assert (len(told), device.serving.api.watches) == (75, 25)
            nursery.cancel_scope.cancel()
    assert told[0].startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"limit of 25 connections from one client (uid 65534)" in told[0]
    assert b"localApi.maxConnectionsPerClient" in told[0]


# ------------------------------------------------------------------------- against the real API server


def _apiserver_get(cp: ControlPlane, path: str, query: dict[str, str]) -> tuple[int, Any]:
    url = f"{cp.server}{path}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {cp.tokens['admin']}"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=cp.ssl_context()) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _both(
    cp: ControlPlane, api: LocalApi, path: str, query: dict[str, str]
) -> tuple[tuple[int, Any], tuple[int, Any]]:
    """The API server's answer and the local API's to the same GET."""
    real = await trio.to_thread.run_sync(_apiserver_get, cp, path, query)
    local = await api.handle(
        Request(
            method="GET", path=path, query=urllib.parse.urlencode(query), headers=(("host", "127.0.0.1"),), body=b""
        )
    )
    return real, (local.status, msgspec.json.decode(local.body))


async def test_selectors_are_refused_as_the_api_server_refuses_them(control_plane: ControlPlane) -> None:
    """Every selector of the refusal table is refused by the real API server and by the local API alike:
    400, with the table's message."""
    api = LocalApi(MemoryCache(), serve_secrets=True, log=structlog.get_logger())
    cases = [("pods", {"labelSelector": s}, m) for s, m in LABEL_ERRORS]
    cases += [(r, {"fieldSelector": s}, m) for r, s, m in FIELD_ERRORS]
    for resource, query, message in cases:
        real, local = await _both(control_plane, api, f"/api/v1/{resource}", query)
        assert (real[0], real[1]["message"]) == (400, message), query
        assert (local[0], local[1]["message"]) == (400, message), query


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ({"watch": "1", "timeoutSeconds": "9" * 309}, "timeoutSeconds"),
        ({"watch": "1", "timeoutSeconds": "soon"}, "timeoutSeconds"),
        ({"limit": "9" * 309}, "limit"),
        ({"labelSelector": f"a>{'9' * 5000}"}, "the value must be an integer"),
    ],
)
async def test_numbers_the_api_server_refuses_are_a_400_naming_them(
    control_plane: ControlPlane, query: dict[str, str], named: str
) -> None:
    """A number query parameter the API server refuses (309 digits, a word, past int64) is refused by the local
    API too: a 400 whose message names the parameter, where it once was a 500."""
    api = LocalApi(MemoryCache(), serve_secrets=True, log=structlog.get_logger())
    real, local = await _both(control_plane, api, "/api/v1/pods", query)
    assert real[0] == 400, real
    assert (local[0], local[1]["reason"]) == (400, "BadRequest")
    assert named in local[1]["message"]


async def test_each_kinds_fields_are_accepted_as_by_the_api_server(control_plane: ControlPlane) -> None:
    """The fields the local API accepts for each kind are ones the API server accepts too."""
    api = LocalApi(MemoryCache(), serve_secrets=True, log=structlog.get_logger())
    for resource, fields in ACCEPTED_FIELDS.items():
        for field in fields:
            real, local = await _both(control_plane, api, f"/api/v1/{resource}", {"fieldSelector": f"{field}=x"})
            assert (real[0], local[0]) == (200, 200), (resource, field)


LABELS = {"app": ("x", "y", "in"), "tier": ("web", ""), "n": ("1", "5", "12", "x")}
NODES = ("edge-a", "edge-b")


@pytest.fixture(scope="module")
def cluster_pods(control_plane: ControlPlane) -> Iterator[tuple[str, Any]]:
    """A namespace of Pods with assorted labels, nodes and restart policies, as the API server lists them."""
    namespace = unique("local-api")
    control_plane.kubectl("create", "namespace", namespace)
    # Pod admission wants the namespace's default ServiceAccount; the controller manager may have made it already.
    control_plane.kubectl("create", "serviceaccount", "default", "-n", namespace, check=False)
    pods = []
    for i in range(12):
        labels = {
            key: values[(i * (j + 1)) % len(values)] for j, (key, values) in enumerate(LABELS.items()) if (i + j) % 4
        }
        spec = {
            "nodeName": NODES[i % 2],
            "automountServiceAccountToken": False,  # the account's token may not exist yet: the Pod would be refused
            "restartPolicy": ("Always", "Never", "OnFailure")[i % 3],
            "containers": [{"name": "c", "image": "busybox"}],
        }
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "labels": labels}, "spec": spec})
    control_plane.kubectl(
        "create", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    )
    status, listing = _apiserver_get(control_plane, f"/api/v1/namespaces/{namespace}/pods", {})
    assert status == 200
    yield namespace, listing
    control_plane.kubectl("delete", "namespace", namespace, "--wait=false")


@st.composite
def label_selectors(draw: st.DrawFn) -> str:
    reqs = []
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted(LABELS)))
        op = draw(st.sampled_from(Operator))
        values = [*LABELS[key], "z"]
        match op:
            case Operator.IN | Operator.NOT_IN:
                chosen = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
            case Operator.EXISTS | Operator.DOES_NOT_EXIST:
                chosen = []
            case Operator.GREATER_THAN | Operator.LESS_THAN:
                chosen = [draw(st.sampled_from(["0", "4", "11"]))]
            case _:
                chosen = [draw(st.sampled_from(values))]
        reqs.append(new_requirement(key, op, chosen))
    return format_label_selector(reqs)


field_selectors = st.lists(
    st.one_of(
        st.builds(FieldRequirement, st.just("spec.nodeName"), st.sampled_from([*NODES, ""]), st.booleans()),
        st.builds(FieldRequirement, st.just("spec.restartPolicy"), st.sampled_from(["Never", "Always"]), st.booleans()),
        st.builds(FieldRequirement, st.just("metadata.name"), st.sampled_from(["p1", "p7"]), st.booleans()),
        st.builds(FieldRequirement, st.just("status.phase"), st.sampled_from(["Pending", ""]), st.booleans()),
        st.builds(FieldRequirement, st.just("status.podIPs"), st.just(""), st.booleans()),
    ),
    max_size=2,
).map(lambda reqs: ",".join(str(r) for r in reqs))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(labels=label_selectors(), fields=field_selectors)
async def test_selectors_select_the_pods_the_api_server_selects(
    control_plane: ControlPlane, cluster_pods: tuple[str, Any], labels: str, fields: str
) -> None:
    """Random label and field selectors select the same Pods from the local API, over a cache of the
    API server's own list, as from the API server."""
    namespace, listing = cluster_pods
    cache = MemoryCache()
    cache.replace("Pod", listing["items"], listing["metadata"]["resourceVersion"])
    api = LocalApi(cache, serve_secrets=False, log=structlog.get_logger())
    query = {"labelSelector": labels, "fieldSelector": fields}
    real, local = await _both(control_plane, api, f"/api/v1/namespaces/{namespace}/pods", query)
    assert real[0] == local[0] == 200, (real, local)
    names = [[item["metadata"]["name"] for item in answer[1]["items"]] for answer in (real, local)]
    assert names[0] == names[1], query
