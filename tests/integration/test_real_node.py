"""Real nodes on this machine: a stock kubelet 1.20.2 with its own containerd, against the local control plane.

Each node here is ``system:node:<name>`` with a client certificate signed by the cluster CA
(``ControlPlane.node_kubeconfig``), held by its kubelet or by a plain-HTTP loopback endpoint its kubelet
uses, so what the tests see is what any real kubelet sees: the Node registers Ready, a pod bound to it
runs from an imported image and answers on its pod IP, a second node runs beside it on the same machine,
a device restart (every process of the node killed) brings a pod back only through the kubelet reading
its pods again, and the Node authorizer and NodeRestriction confine the node's credentials to its own
objects.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.controlplane import ControlPlane
from tests.integration.objects import unique
from tests.integration.real_nodes import create, get, ready_node, running, serving_pod, until
from tools.provision import node_images
from tools.provision.node import Node, NodeTools, ensure_node_tools, start_node, web_pod
from tools.provision.pki import plain_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.slow(80)]


def as_node(cp: ControlPlane, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl with a node's own credentials."""
    return subprocess.run(
        [str(cp.binaries.kubectl), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def node_tools() -> NodeTools:
    return ensure_node_tools()


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = unique("real-node")
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


@contextlib.contextmanager
def started(
    cp: ControlPlane, tmp: pytest.TempPathFactory, tools: NodeTools, name: str, kubeconfig: Path
) -> Iterator[Node]:
    """Node ``name`` started with ``kubeconfig``, once Ready; stopped and its Node deleted afterwards."""
    node = start_node(tmp.mktemp(name), name, kubeconfig, tools)
    try:
        until(f"node {name} Ready", lambda: ready_node(cp, name))
        yield node
    finally:
        node.stop()
        cp.kubectl("delete", "node", name, "--ignore-not-found")


@contextlib.contextmanager
def loopback_endpoint(cp: ControlPlane, credentials: Path) -> Iterator[str]:
    """A plain-HTTP endpoint on loopback that forwards to the API server with ``credentials``, as a
    device's endpoint does with its node's (``kubectl proxy`` stands in for it): its URL."""
    proxy = subprocess.Popen(
        [str(cp.binaries.kubectl), f"--kubeconfig={credentials}", "proxy", "--port=0", "--address=127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        first = proxy.stdout.readline()  # "Starting to serve on 127.0.0.1:PORT"
        assert "Starting to serve on" in first, first
        yield f"http://{first.split()[-1]}"
    finally:
        proxy.terminate()
        proxy.wait()


@pytest.fixture(scope="module")
def node_a(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory, node_tools: NodeTools
) -> Iterator[Node]:
    """A real node whose kubelet holds a CA-signed ``system:node`` certificate (module-long: starting one
    costs seconds of a loaded machine)."""
    name = unique("real-a")
    kubeconfig = control_plane.node_kubeconfig(name, tmp_path_factory.mktemp("a-credentials"))
    with started(control_plane, tmp_path_factory, node_tools, name, kubeconfig) as node:
        yield node


@pytest.fixture(scope="module")
def node_b(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory, node_tools: NodeTools
) -> Iterator[Node]:
    """A second real node on the same machine, at the same time, whose kubelet reaches the API through a
    plain-HTTP loopback endpoint holding its node certificate (its kubeconfig has no credentials)."""
    name = unique("real-b")
    credentials = control_plane.node_kubeconfig(name, tmp_path_factory.mktemp("b-credentials"))
    with loopback_endpoint(control_plane, credentials) as url:
        kubeconfig = tmp_path_factory.mktemp("b-kubeconfig") / "kubeconfig"
        kubeconfig.write_text(plain_kubeconfig(url))
        with started(control_plane, tmp_path_factory, node_tools, name, kubeconfig) as node:
            yield node


def test_a_kubelet_with_a_node_certificate_registers_ready_and_serves_a_pod(
    control_plane: ControlPlane, namespace: str, node_a: Node
) -> None:
    """The node registers Ready (containerd, v1.20.2); a pod bound to it, its page in a ConfigMap, runs
    from the imported image and answers from its pod IP in the node's own subnet."""
    node = ready_node(control_plane, node_a.name)
    assert node is not None
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.20.2"
    page = f"served by {node_a.name}\n"
    control_plane.kubectl("create", "configmap", "page", "-n", namespace, f"--from-literal=index.html={page}")
    create(control_plane, namespace, web_pod("web-a", node_a.name, page_configmap="page"))

    pod = until("pod web-a serving", lambda: serving_pod(control_plane, namespace, "web-a"))

    assert pod["page"] == page
    assert pod["status"]["podIP"].startswith(node_a.network.subnet.removesuffix("0/24"))
    assert node_a.healthz() == (200, "ok")


def test_two_nodes_run_their_pods_at_once_on_one_machine(
    control_plane: ControlPlane, namespace: str, node_a: Node, node_b: Node
) -> None:
    """Two kubelets with their own containerds, ports, cgroup roots and bridges (one of them reaching the API
    through a loopback endpoint) are Ready together, and each runs its own pod, which says which node it
    is on."""
    say_node = ["/bin/sh", "-c", 'echo "on $NODE" > /tmp/index.html && exec httpd -f -p 8088 -h /tmp']
    for node in (node_a, node_b):
        manifest = web_pod(f"where-{node.name}", node.name, command=say_node)
        manifest["spec"]["containers"][0]["env"] = [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        ]
        create(control_plane, namespace, manifest)

    pods = {}
    for node in (node_a, node_b):
        pod = f"where-{node.name}"
        pods[node.name] = until(f"pod {pod} serving", functools.partial(serving_pod, control_plane, namespace, pod))

    assert {name: pod["page"] for name, pod in pods.items()} == {n.name: f"on {n.name}\n" for n in (node_a, node_b)}
    assert all(ready_node(control_plane, n.name) for n in (node_a, node_b))
    assert len({node_a.cgroup_root, node_b.cgroup_root}) == 2
    assert len({node_a.network.bridge, node_b.network.bridge}) == 2


def _web_container(cp: ControlPlane, namespace: str, pod: str) -> tuple[str, int]:
    """(container ID, restart count) of a pod's web container, as its kubelet reported them."""
    status = get(cp, "pod", "-n", namespace, pod)
    assert status is not None
    (web,) = status["status"]["containerStatuses"]
    return web["containerID"].removeprefix("containerd://"), int(web["restartCount"])


def test_a_device_restart_brings_the_pod_back_only_through_the_kubelet(
    control_plane: ControlPlane, namespace: str, node_b: Node
) -> None:
    """A kubelet restart leaves the container running; a power cut kills it (its PID is gone), containerd
    alone does not bring it back, and the kubelet, reading its pods, starts a new container that serves."""
    create(control_plane, namespace, web_pod("survivor", node_b.name))
    until("pod survivor serving", lambda: serving_pod(control_plane, namespace, "survivor"))
    first, restarts = _web_container(control_plane, namespace, "survivor")
    first_pid = node_b.tasks()[first]

    node_b.restart_kubelet()
    assert node_b.tasks().get(first) == first_pid

    node_b.power_off()
    assert not running(first_pid)
    node_b.power_on(kubelet=False)
    assert node_b.tasks() == {}

    node_b.start_kubelet()
    pod = until("pod survivor serving again", lambda: serving_pod(control_plane, namespace, "survivor"))
    second, restarts_after = _web_container(control_plane, namespace, "survivor")
    assert pod["page"] == node_images.WEB_PAGE.decode()
    assert second != first
    assert restarts_after > restarts
    assert node_b.tasks()[second] != first_pid


def test_a_node_may_read_only_its_pods_secrets_and_patch_only_its_own_node(
    control_plane: ControlPlane, namespace: str, node_a: Node, node_b: Node
) -> None:
    """With node A's credentials a Secret referenced by a pod on A is readable, another Secret is refused
    (the Node authorizer), A's own Node can be labelled and B's cannot (NodeRestriction)."""
    control_plane.kubectl("create", "secret", "generic", "used", "-n", namespace, "--from-literal=k=v")
    control_plane.kubectl("create", "secret", "generic", "unused", "-n", namespace, "--from-literal=k=v")
    manifest = web_pod("with-secret", node_a.name)
    manifest["spec"]["volumes"] = [{"name": "s", "secret": {"secretName": "used"}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/secret"}]
    create(control_plane, namespace, manifest)
    until("pod with-secret serving", lambda: serving_pod(control_plane, namespace, "with-secret"))
    credentials = node_a.kubeconfig

    used = as_node(control_plane, credentials, "get", "secret", "used", "-n", namespace)
    unused = as_node(control_plane, credentials, "get", "secret", "unused", "-n", namespace)
    own = as_node(control_plane, credentials, "label", "node", node_a.name, "checked=yes", "--overwrite")
    other = as_node(control_plane, credentials, "label", "node", node_b.name, "checked=yes", "--overwrite")

    assert used.returncode == 0, used.stderr
    assert unused.returncode != 0
    assert "Forbidden" in unused.stderr
    assert own.returncode == 0, own.stderr
    assert other.returncode != 0
    assert "Forbidden" in other.stderr
    assert f'is not allowed to modify node "{node_b.name}"' in other.stderr
