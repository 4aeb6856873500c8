"""A device's disk failing under the agent's cache while its kubelet runs a pod: the agent (under its
launcher) keeps its data on a small tmpfs of its own (``tmpfs.py``), the controller and a hub relaying the
device's API requests run as processes, and a stock kubelet and containerd behind the agent's ``nodeApi``
run the pod (``device_nodes``). The full disk is ``test_autonomy_e2e``'s, now with a real node."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.integration.agents import write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.device_nodes import HUB_OPTIONS, answers, device_node, eventually, node_api, web_container
from tests.integration.fleet import admin, register_edges
from tests.integration.full_disk import fill
from tests.integration.objects import unique
from tests.integration.processes import fleet
from tests.integration.real_nodes import create, running
from tests.integration.test_autonomy_e2e import (
    ANNOTATION_BYTES,
    QUICK_AUTONOMY,
    QUICK_CONDITIONS,
    agent_log,
    approved,
    autonomy_of,
    condition_changes,
    request_autonomy,
    supervised_on_tmpfs,
)
from tests.integration.tmpfs import seen_by, usable
from tools.ports import free_port
from tools.provision.node import web_pod

pytestmark = [pytest.mark.integration, pytest.mark.slow(45)]


async def test_a_full_disk_under_the_cache_turns_autonomy_unknown_and_back_while_the_pod_keeps_running(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """With a pod running on the device's kubelet, its agent's tmpfs filled up: the pods then bound to the
    node cannot be cached, their keys are errored and the fourth failing check turns the Autonomy condition
    Unknown; once space is freed the repair loop clears the keys and the condition is True again. All the
    while the first pod's container keeps its PID and answers."""
    cp = crds
    usable(tmp_path)
    node = unique("disk")
    tokens = await register_edges(cp, [node])
    namespace = unique("disk")
    cp.kubectl("create", "namespace", namespace)
    try:
        await scenario(cp, tmp_path, node, tokens[node], namespace)
    finally:
        cp.kubectl("delete", "namespace", namespace, "--wait=false")


async def scenario(cp: ControlPlane, tmp_path: Path, node: str, token: str, namespace: str) -> None:
    port = free_port()
    home = tmp_path / node
    data, log = home / "data", home / "agent.log"
    data.mkdir(parents=True)
    hub_options = {**HUB_OPTIONS, **QUICK_CONDITIONS}
    async with fleet(cp, tmp_path, edges=0, hubs=1, hub_options=hub_options) as running_fleet, admin(cp) as kube:
        config = write_agent_config(
            home,
            node=node,
            token=token,
            hub_urls=running_fleet.hub_urls,
            logFormat="json",
            autonomy=QUICK_AUTONOMY,
            **node_api(port),
        )
        async with supervised_on_tmpfs(config, data, log) as launcher, device_node(cp, tmp_path, node, port) as device:
            await request_autonomy(kube, node)
            create(cp, namespace, web_pod("web", node))
            first, pid, ip = await eventually("the pod running", lambda: web_container(cp, device, namespace, "web"))
            await approved(kube, node, "True", "true")
            missed: list[str] = []

            async def probe_the_pod() -> None:
                """Record every time the pod does not answer or its container is not the first one."""
                while True:
                    if await anyio.to_thread.run_sync(answers, ip) is None:
                        missed.append("no answer")
                    if not running(pid) or device.tasks().get(first) != pid:
                        missed.append("container replaced")
                    await anyio.sleep(0.5)

            async with anyio.create_task_group() as tg:
                tg.start_soon(probe_the_pod)
                filler = seen_by(launcher.pid, data / "filler")
                assert await anyio.to_thread.run_sync(fill, filler) > 0
                big = sorted(unique("big") for _ in range(3))
                for name in big:
                    pod = web_pod(name, node)
                    pod["metadata"]["annotations"] = {"filler": "x" * ANNOTATION_BYTES}
                    create(cp, namespace, pod)

                found = await approved(kube, node, "Unknown", "false")
                condition = autonomy_of(found)
                assert condition is not None
                assert condition.reason == "cache failed"
                for name in big:
                    assert f"Pod/{namespace}/{name}" in condition.message
                assert condition_changes(agent_log(log))[-1] == ("Unknown", 4)

                await anyio.to_thread.run_sync(filler.unlink)
                await approved(kube, node, "True", "true")
                assert condition_changes(agent_log(log))[-1] == ("True", 0)
                tg.cancel_scope.cancel()
            assert missed == []
            assert device.tasks()[first] == pid
