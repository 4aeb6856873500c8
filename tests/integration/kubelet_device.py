"""A device whose agent may upgrade and configure its kubelet: what the kubelet job tests and the kubelet benchmark
run on. The controller, a hub relaying the device's API requests, the agent with its ``kubelet`` block on, and
the node (containerd, and the kubelet under its supervisor) running one web pod."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.integration.controlplane import ControlPlane
from tests.integration.device_nodes import HUB_OPTIONS, device_node, node_api, node_dir
from tests.integration.objects import unique
from tests.integration.processes import fleet
from tests.integration.real_nodes import create
from tools.ports import free_ports
from tools.provision.node import Node, web_pod
from tools.provision.node_config import Layout
from tools.provision.node_device import kubelet_restart_command

HEALTH_DEADLINE_S = 25
"""The tests' kubelets that cannot start are rolled back after this long; a good one is healthy in a few seconds
(about 4 from dispatch, fetching its 100 MB artifact included, in the kubelet benchmark)."""


@asynccontextmanager
async def kubelet_device(cp: ControlPlane, home: Path, image: str) -> AsyncIterator[tuple[str, Node, str]]:
    """A device whose supervised kubelet its agent may upgrade (from ``image``) and configure, running the web pod
    ``web``: its name, node and the pod's namespace."""
    port, healthz = free_ports(2)
    state = node_dir(home)
    kubelet = {
        "binary": str(state / "kubelet"),
        "restartCommand": kubelet_restart_command(state),
        "healthzUrl": f"http://127.0.0.1:{healthz}/healthz",
        "healthDeadline": HEALTH_DEADLINE_S,
        "upgradeImage": image,
        "configFile": str(Layout(state).kubelet_config),
    }
    options = {**node_api(port), "kubelet": kubelet}
    namespace = unique("kubelet")
    cp.kubectl("create", "namespace", namespace)
    try:
        async with fleet(cp, home, edges=1, hubs=1, hub_options=HUB_OPTIONS, edge_options=lambda _: options) as running:
            (name,) = running.edges
            async with device_node(cp, home, name, port, supervised=True, healthz_port=healthz) as node:
                create(cp, namespace, web_pod("web", name))
                yield name, node, namespace
    finally:
        cp.kubectl("delete", "namespace", namespace, "--wait=false")


__all__ = ["HEALTH_DEADLINE_S", "kubelet_device"]
