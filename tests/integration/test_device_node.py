"""A nodetaskd device as a real Kubernetes node: a stock kubelet whose only API server is the agent's endpoint.

The controller, a hub relaying (``apiRelay``) and an agent with ``nodeApi`` run as processes; the device's
kubelet and containerd are real (``tools/provision/node.py``), its kubeconfig names the agent's loopback
endpoint and holds no credentials: the agent gets the node's certificate through its hub and the CSR API
and speaks as the node. The pod's page is a ConfigMap mounted into it, so that the device needs the
cloud's objects, not only its own containers, to run it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest

from tests.integration.controlplane import ControlPlane
from tests.integration.device_nodes import answers as answer
from tests.integration.device_nodes import eventually
from tests.integration.objects import unique
from tests.integration.processes import fleet
from tests.integration.real_nodes import create, get, ready_node, running, serving_pod
from tools.ports import free_port
from tools.provision.node import Node, ensure_node_tools, start_node, web_pod
from tools.provision.pki import plain_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.slow(90)]
LIMIT_S = 120.0
STATUS_PERIOD_S = 10.0
"""The kubelet's node status period (``nodeStatusUpdateFrequency``, its default)."""


def pod_ip(pid: int) -> str | None:
    """The IPv4 address of the network namespace process ``pid`` is in (its pod's IP), read on the device."""
    result = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ip", "-4", "-o", "addr", "show", "eth0"],
        capture_output=True,
        text=True,
        check=False,
    )
    fields = result.stdout.split()
    return fields[fields.index("inet") + 1].partition("/")[0] if "inet" in fields else None


def restarted_pod(node: Node, before: dict[str, int]) -> tuple[dict[str, int], str] | None:
    """The containers the node's containerd runs that were not in ``before`` (the pod's new sandbox and web
    container), and the pod's IP, once its web server answers there."""
    new = {container: pid for container, pid in node.tasks().items() if container not in before and running(pid)}
    for pid in new.values():
        if (ip := pod_ip(pid)) and answer(ip) is not None:
            return new, ip
    return None


def container_of(cp: ControlPlane, namespace: str, pod: str) -> tuple[str, int]:
    status = get(cp, "pod", "-n", namespace, pod)
    assert status is not None
    (web,) = status["status"]["containerStatuses"]
    return web["containerID"].removeprefix("containerd://"), int(web["restartCount"])


async def test_a_kubelet_behind_the_agent_keeps_its_pod_offline_and_through_a_device_restart(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """The kubelet registers its Node Ready through the agent and runs a pod whose page comes from a
    ConfigMap; with every hub SIGKILLed the pod keeps answering for two status periods, its container
    untouched; a whole device restart while the cloud is still gone (containers and shims killed, then
    containerd, the kubelet and the agent started again) brings the pod back from the device's cache
    alone; with the hub back the Node is Ready and the pod's status the new container's."""
    cp = crds
    port = free_port()
    tools = await anyio.to_thread.run_sync(ensure_node_tools)
    namespace = unique("device")
    cp.kubectl("create", "namespace", namespace)
    hub_options: dict[str, object] = {"apiRelay": {"enabled": True}}

    def node_api(_: int) -> dict[str, object]:
        return {"nodeApi": {"enabled": True, "port": port}}

    async with fleet(cp, tmp_path, edges=1, hubs=1, hub_options=hub_options, edge_options=node_api) as running_fleet:
        (name,) = running_fleet.edges
        agent = running_fleet.edges[name]
        kubeconfig = tmp_path / "kubelet.kubeconfig"
        kubeconfig.write_text(plain_kubeconfig(f"http://127.0.0.1:{port}"))
        # The kubelet registers its own Node, as on a real device (it cannot take over a Node made
        # without its capacity: kubelet 1.20 panics reconciling its hugepages).
        cp.kubectl("delete", "node", name)
        page = f"served by {name}\n"
        cp.kubectl("create", "configmap", "page", "-n", namespace, f"--from-literal=index.html={page}")
        node = await anyio.to_thread.run_sync(start_node, tmp_path / "node", name, kubeconfig, tools)
        try:
            await eventually("Node Ready through the agent", lambda: ready_node(cp, name))
            create(cp, namespace, web_pod("web", name, page_configmap="page"))
            pod = await eventually("pod serving", lambda: serving_pod(cp, namespace, "web"))
            assert pod["page"] == page
            first, restarts = container_of(cp, namespace, "web")
            first_pid = node.tasks()[first]

            # Every hub gone: the pod keeps answering and the kubelet leaves its container alone.
            for hub in running_fleet.hubs:
                await hub.kill()
            with anyio.fail_after(LIMIT_S):
                seen = 0
                while seen < 2 * STATUS_PERIOD_S + 5:
                    assert await anyio.to_thread.run_sync(answer, pod["status"]["podIP"]) == page
                    await anyio.sleep(1)
                    seen += 1
            assert node.tasks().get(first) == first_pid
            assert running(first_pid)

            # A whole device restart while the cloud is still gone.
            before = node.tasks()
            await anyio.to_thread.run_sync(node.power_off)
            await agent.kill()
            assert not running(first_pid)
            await agent.start()
            await anyio.to_thread.run_sync(node.power_on)
            new, ip = await eventually("the pod back from the cache", lambda: restarted_pod(node, before))
            assert first not in new
            assert await anyio.to_thread.run_sync(answer, ip) == page

            # The cloud back: the Node is Ready and the pod's status is the new container's.
            for hub in running_fleet.hubs:
                await hub.start()
            await eventually("Node Ready again", lambda: ready_node(cp, name))

            def current() -> tuple[str, int] | None:
                found = container_of(cp, namespace, "web")
                return found if found[0] in new else None

            _, restarts_after = await eventually("the pod's status current", current)
            assert restarts_after > restarts
        finally:
            await anyio.to_thread.run_sync(node.stop)
            cp.kubectl("delete", "namespace", namespace, "--wait=false")
            cp.kubectl("delete", "node", name, "--ignore-not-found")
