"""NodeUpgradeJob and ConfigUpdateJob with ``component: kubelet`` on a device that is a real node: the agent swaps
the node's kubelet for an artifact from a registry, or sets fields of its KubeletConfiguration, restarts it under
its supervisor (``tools/provision/supervise.py``, standing in for systemd) and judges it by its ``healthz`` and
its Node; a kubelet that does not come back is rolled back. The controller, a hub relaying the device's API
requests, the agent, the kubelet, containerd and the registry are real processes."""

from __future__ import annotations

import functools
import hashlib
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import CONFIG_UPDATE_JOB, NODE_UPGRADE_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.device_nodes import eventually, node_dir, web_container
from tests.integration.kubelet_device import kubelet_device
from tests.integration.objects import create_job, job_when, settled, unique
from tests.integration.real_nodes import get, serving_pod
from tools.provision import kubebuild, node_inspect, upgrade_artifact
from tools.provision.containerd import Registry
from tools.provision.node import Node
from tools.provision.node_config import Layout

pytestmark = [pytest.mark.integration, pytest.mark.slow(150)]
UPGRADES = job_resource(NODE_UPGRADE_JOB)
BASE = f"v{kubebuild.KUBERNETES_VERSION}"
NEXT = f"v{kubebuild.NEXT_KUBELET_VERSION}"
BROKEN = "v1.20.4-broken.1"
CONFIGS = job_resource(CONFIG_UPDATE_JOB)


def _kubelet_version(cp: ControlPlane, name: str) -> str:
    node = get(cp, "node", name)
    return str(node["status"]["nodeInfo"]["kubeletVersion"]) if node else ""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _backups(home: Path, node: str) -> dict[str, str]:
    """The device's kubelet backups: each version's digest (the agent's ``dataDir`` is the fleet's)."""
    root = home / node / "data" / "kubelet" / "backup"
    return {entry.name: _digest(entry / "kubelet") for entry in root.iterdir()}


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
    ran through both restarts; the same job again is Successful at selection and backs nothing up, and a
    downgrade is refused."""
    cp = crds
    built = await anyio.to_thread.run_sync(kubebuild.ensure_built, ("kubelet-next",))
    image = f"{registry.host}/nodetaskd/kubelet"
    kubelet = built["kubelet-next"].read_bytes()
    await anyio.to_thread.run_sync(functools.partial(upgrade_artifact.push, image, NEXT, kubelet=kubelet))
    await anyio.to_thread.run_sync(
        lambda: upgrade_artifact.push(image, BROKEN, kubelet=upgrade_artifact.broken_kubelet(BROKEN))
    )
    binary = node_dir(tmp_path) / "kubelet"
    async with kubelet_device(cp, tmp_path, image) as (name, node, namespace):
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
        assert _backups(tmp_path, name) == {BASE: original}  # the job for the running version backed nothing up


async def _configure(cp: ControlPlane, kube: Kube, node: str, fields: dict[str, str]) -> Any:
    job = unique("kubelet-config")
    spec = {"nodeNames": [node], "component": "kubelet", "updateFields": fields, "timeoutSeconds": 300}
    await create_job(cp, "ConfigUpdateJob", job, spec)
    return await job_when(kube, CONFIGS, job, settled, limit_s=240)


def _pods_capacity(cp: ControlPlane, name: str) -> str:
    node = get(cp, "node", name)
    return str(node["status"]["capacity"]["pods"]) if node else ""


def _anonymous_configz(node: Node) -> int:
    """The status the kubelet answers ``/configz`` with to a client without a certificate."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{node.kubelet_port}/configz", context=context, timeout=5):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


async def _configz(node: Node) -> dict[str, Any]:
    """What the kubelet's ``/configz`` says it runs with (asked with the harness's client certificate)."""
    return await anyio.to_thread.run_sync(node_inspect.configz, node.layout.inspector_dir, node.kubelet_port)


async def test_a_kubelet_setting_is_applied_and_one_the_kubelet_rejects_is_rolled_back(
    crds: ControlPlane, cloud_kube: Kube, registry: Registry, tmp_path: Path
) -> None:
    """``maxPods: 42`` completes, the kubelet's ``/configz`` says 42 and its Node 42 pods of capacity; an image GC
    threshold below the low one, which the kubelet's own validation rejects at start, fails with the reason and
    leaves the previous file running; the pod's container runs throughout. (The webhook's refusals:
    ``test_webhook``.)"""
    cp = crds
    config = Layout(node_dir(tmp_path)).kubelet_config
    async with kubelet_device(cp, tmp_path, f"{registry.host}/nodetaskd/kubelet") as (name, node, namespace):
        before = await eventually("the web pod's container", lambda: web_container(cp, node, namespace, "web"))
        assert _pods_capacity(cp, name) == "110"
        assert (await _configz(node))["maxPods"] == 110
        assert _anonymous_configz(node) == 401  # the harness's certificate is what lets it in

        done = await _configure(cp, cloud_kube, name, {"maxPods": "42"})
        assert done.status.phase is JobPhase.COMPLETED, done.status
        assert json.loads(config.read_text())["maxPods"] == 42
        # At once: the job completes only once the restarted kubelet has posted its Node.
        assert _pods_capacity(cp, name) == "42"
        assert (await _configz(node))["maxPods"] == 42
        applied = config.read_bytes()

        failed = await _configure(cp, cloud_kube, name, {"imageGCHighThresholdPercent": "50"})
        assert failed.status.phase is JobPhase.FAILURE, failed.status
        (entry,) = failed.status.node_status
        assert entry.reason.startswith("the config update failed and the previous config was restored: "), entry
        assert "was not healthy within" in entry.reason, entry.reason
        assert config.read_bytes() == applied
        assert node.healthz()[0] == 200
        assert _pods_capacity(cp, name) == "42"
        running = await _configz(node)
        assert (running["maxPods"], running["imageGCHighThresholdPercent"]) == (42, 100), running
        after = await eventually("the web pod's container", lambda: web_container(cp, node, namespace, "web"))
        assert after[:2] == before[:2], (before, after)
