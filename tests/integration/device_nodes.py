"""A running edge agent's device as a real node for end-to-end tests: a stock kubelet and containerd
(``tools/provision/node.py``) whose only API server is the agent's ``nodeApi`` endpoint, as in
``test_device_node``; the Node it registers labelled an edge node, as an operator labels a device's."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final, TypeVar

import anyio
import pytest

from schemas.core import EDGE_ROLE_LABEL
from tests.integration.controlplane import ControlPlane
from tests.integration.real_nodes import fetch, get, ready_node, running
from tools.provision.node import Node, ensure_node_tools, start_node
from tools.provision.node_config import Layout
from tools.provision.pki import plain_kubeconfig

T = TypeVar("T")
LIMIT_S: Final = 120.0
HUB_OPTIONS: Final[dict[str, object]] = {"apiRelay": {"enabled": True}}
"""What a hub needs to relay a device node's API requests."""


async def eventually(what: str, probe: Callable[[], T | None], limit_s: float = LIMIT_S) -> T:
    """The first value the blocking ``probe()`` gives that is not None, asked twice a second in a thread."""
    with anyio.move_on_after(limit_s):
        while (value := await anyio.to_thread.run_sync(probe)) is None:  # noqa: ASYNC110 - a blocking probe, no event
            await anyio.sleep(0.5)
        return value
    pytest.fail(f"{what}: not after {limit_s:g} s")


def node_dir(home: Path) -> Path:
    return home / "node"


def cri_endpoint(home: Path) -> str:
    """Where the containerd of the node started in ``home`` will serve CRI: known before it starts, so that
    the agent's config (``criEndpoint``) can name it."""
    return f"unix://{Layout(node_dir(home)).socket}"


def node_api(port: int) -> dict[str, object]:
    return {"nodeApi": {"enabled": True, "port": port}}


@asynccontextmanager
async def device_node(
    cp: ControlPlane, home: Path, name: str, port: int, *, supervised: bool = False, healthz_port: int = 0
) -> AsyncIterator[Node]:
    """The kubelet of node ``name`` talking to the agent's ``nodeApi`` on ``port``, once its Node is Ready
    and labelled an edge node; stopped, and its Node deleted, at the end. ``supervised`` and
    ``healthz_port`` are :func:`start_node`'s."""
    tools = await anyio.to_thread.run_sync(ensure_node_tools)
    kubeconfig = home / "kubelet.kubeconfig"
    kubeconfig.write_text(plain_kubeconfig(f"http://127.0.0.1:{port}"))
    # The kubelet registers its own Node (kubelet 1.20 panics taking over one made without its capacity),
    # and may not give it the edge-role label itself (a kubelet may set no node-role.kubernetes.io label).
    cp.kubectl("delete", "node", name, "--ignore-not-found")
    node = await anyio.to_thread.run_sync(
        functools.partial(
            start_node, node_dir(home), name, kubeconfig, tools, supervised=supervised, healthz_port=healthz_port
        )
    )
    try:
        await eventually("Node Ready through the agent", lambda: ready_node(cp, name))
        cp.kubectl("label", "node", name, f"{EDGE_ROLE_LABEL}=")
        yield node
    finally:
        await anyio.to_thread.run_sync(node.stop)
        cp.kubectl("delete", "node", name, "--ignore-not-found")


def web_container(cp: ControlPlane, node: Node, namespace: str, pod: str) -> tuple[str, int, str] | None:
    """The ID and PID of the pod's one container on the node and the pod's IP, once its status names a
    container the node's containerd runs."""
    found = get(cp, "pod", "-n", namespace, pod)
    statuses = found["status"].get("containerStatuses", []) if found else []
    if found is None or len(statuses) != 1 or not found["status"].get("podIP"):
        return None
    container = statuses[0].get("containerID", "").removeprefix("containerd://")
    pid = node.tasks().get(container)
    return (container, pid, found["status"]["podIP"]) if pid is not None and running(pid) else None


def answers(ip: str) -> str | None:
    """What the web server of the pod at ``ip`` answers, or None."""
    return fetch({"status": {"podIP": ip}})


__all__ = [
    "HUB_OPTIONS",
    "answers",
    "cri_endpoint",
    "device_node",
    "eventually",
    "node_api",
    "node_dir",
    "web_container",
]
