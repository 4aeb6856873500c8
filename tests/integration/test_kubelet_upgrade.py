"""NodeUpgradeJob with ``component: kubelet`` on a device that is a real node: the agent swaps the node's
kubelet for an artifact from a registry, restarts it under its supervisor (``tools/provision/supervise.py``,
standing in for systemd) and judges it by its ``healthz`` and its Node; a kubelet that cannot start is rolled
back. The controller, a hub relaying the device's API requests, the agent, the kubelet, containerd and the
registry are real processes."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import NODE_UPGRADE_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.device_nodes import HUB_OPTIONS, device_node, eventually, node_api, node_dir, web_container
from tests.integration.objects import create_job, job_when, settled, unique
from tests.integration.processes import fleet
from tests.integration.real_nodes import create, get, serving_pod
from tools.ports import free_ports
from tools.provision import kubebuild, upgrade_artifact
from tools.provision.containerd import Registry
from tools.provision.node import web_pod

pytestmark = [pytest.mark.integration, pytest.mark.slow(150)]
UPGRADES = job_resource(NODE_UPGRADE_JOB)
BASE = f"v{kubebuild.KUBERNETES_VERSION}"
NEXT = f"v{kubebuild.NEXT_KUBELET_VERSION}"
BROKEN = "v1.20.4-broken.1"
HEALTH_DEADLINE_S = 40


def _kubelet_version(cp: ControlPlane, name: str) -> str:
    node = get(cp, "node", name)
    return str(node["status"]["nodeInfo"]["kubeletVersion"]) if node else ""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _upgrade(cp: ControlPlane, kube: Kube, node: str, version: str, **extra: object) -> Any:
    job = unique("kubelet")
    spec = {"nodeNames": [node], "version": version, "component": "kubelet", "timeoutSeconds": 300, **extra}
    await create_job(cp, "NodeUpgradeJob", job, spec)
    return await job_when(kube, UPGRADES, job, settled, limit_s=240)


async def test_a_kubelet_that_cannot_start_is_rolled_back_and_the_next_build_is_installed_under_a_running_pod(
    crds: ControlPlane, cloud_kube: Kube, registry: Registry, tmp_path: Path
) -> None:
    """A kubelet artifact that exits at once fails with the reason and leaves the old kubelet running; the
    next build (the same source, another version) completes, the Node reports it, and the pod's container
    ran through both restarts; the same job again is Successful at selection, and a downgrade is refused."""
    cp = crds
    built = await anyio.to_thread.run_sync(kubebuild.ensure_built, ("kubelet-next",))
    image = f"{registry.host}/nodetaskd/kubelet"
    await anyio.to_thread.run_sync(
        lambda: upgrade_artifact.push(image, NEXT, kubelet=built["kubelet-next"].read_bytes())
    )
    await anyio.to_thread.run_sync(
        lambda: upgrade_artifact.push(image, BROKEN, kubelet=upgrade_artifact.broken_kubelet(BROKEN))
    )
    port, healthz = free_ports(2)
    home = node_dir(tmp_path)
    binary = home / "kubelet"
    node_py = Path(kubebuild.__file__).with_name("node.py")
    kubelet = {
        "binary": str(binary),
        "restartCommand": [sys.executable, str(node_py), "restart-kubelet", str(home)],
        "healthzUrl": f"http://127.0.0.1:{healthz}/healthz",
        "healthDeadline": HEALTH_DEADLINE_S,
        "upgradeImage": image,
    }
    options = {**node_api(port), "kubelet": kubelet}
    namespace = unique("kubelet")
    cp.kubectl("create", "namespace", namespace)
    try:
        async with fleet(cp, tmp_path, edges=1, hubs=1, hub_options=HUB_OPTIONS, edge_options=lambda _: options) as f:
            (name,) = f.edges
            async with device_node(cp, tmp_path, name, port, supervised=True, healthz_port=healthz) as node:
                create(cp, namespace, web_pod("web", name))
                before = await eventually("the web pod's container", lambda: web_container(cp, node, namespace, "web"))
                original = _digest(binary)
                assert _kubelet_version(cp, name) == BASE

                failed = await _upgrade(cp, cloud_kube, name, BROKEN)
                assert failed.status.phase is JobPhase.FAILURE, failed.status
                (entry,) = failed.status.node_status
                assert entry.phase is NodeTaskPhase.FAILURE
                assert "rolled back" in entry.reason, entry.reason
                assert f"kubelet {BASE} runs again, {BROKEN} failed" in entry.reason, entry.reason
                assert "was not healthy within" in entry.reason, entry.reason
                assert [(a.action, a.status) for a in entry.action_flow][-2:] == [
                    ("Upgrade", "False"),
                    ("RollBack", "True"),
                ]
                assert _digest(binary) == original
                assert node.healthz()[0] == 200
                assert _kubelet_version(cp, name) == BASE

                done = await _upgrade(cp, cloud_kube, name, NEXT)
                assert done.status.phase is JobPhase.COMPLETED, done.status
                assert _kubelet_version(cp, name) == NEXT
                wide = cp.kubectl("get", "node", name, "-o", "wide").stdout
                assert NEXT in wide, wide
                assert _digest(binary) == _digest(built["kubelet-next"])
                after = await eventually("the web pod's container", lambda: web_container(cp, node, namespace, "web"))
                assert after[:2] == before[:2], (before, after)  # the same container, the same process
                await eventually("the web pod serving", lambda: serving_pod(cp, namespace, "web"))

                again = await _upgrade(cp, cloud_kube, name, NEXT)
                assert again.status.phase is JobPhase.COMPLETED, again.status
                assert "already runs version" in again.status.node_status[0].reason

                back = await _upgrade(cp, cloud_kube, name, BASE)
                assert back.status.phase is JobPhase.FAILURE, back.status
                assert f"refusing to downgrade the kubelet from {NEXT} to {BASE}" in back.status.node_status[0].reason
                assert _kubelet_version(cp, name) == NEXT
    finally:
        cp.kubectl("delete", "namespace", namespace, "--wait=false")
