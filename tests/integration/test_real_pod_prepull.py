"""An ImagePrePullJob on a device that is a real node: the agent pulls through the CRI of the node's own
containerd (``criEndpoint``), and the kubelet then runs a pod that may never pull it. The controller, a
hub relaying the device's API requests and the agent run as processes; the kubelet, containerd and the
registry on loopback are real."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from nodetask.phases import JobPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import IMAGE_PRE_PULL_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.device_nodes import HUB_OPTIONS, cri_endpoint, device_node, eventually, node_api
from tests.integration.objects import create_job, job_when, settled, unique
from tests.integration.processes import fleet
from tests.integration.real_nodes import create, serving_pod
from tools.ports import free_port
from tools.provision import node_images
from tools.provision.node import web_pod
from tools.provision.registry import start_registry

pytestmark = [pytest.mark.integration, pytest.mark.slow(60)]
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)


async def test_an_image_pre_pulled_through_the_nodes_cri_runs_a_pod_that_never_pulls(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """The web image, pushed under a new name to a registry on loopback, is not on the node; the
    ImagePrePullJob for the node completes; then a pod of that image with ``imagePullPolicy: Never`` runs
    on the node's kubelet and answers."""
    cp = crds
    port = free_port()
    # The node's containerd needs no hosts.toml for it: its CRI plugin (1.6) speaks plain HTTP to a registry
    # on loopback.
    registry = await anyio.to_thread.run_sync(start_registry, tmp_path / "registry")
    namespace, job = unique("prepull"), unique("prepull")
    cp.kubectl("create", "namespace", namespace)
    try:
        image = registry.push_archive(node_images.ensure_images().web, unique("web"))
        options = {**node_api(port), "criEndpoint": cri_endpoint(tmp_path)}
        async with (
            fleet(cp, tmp_path, edges=1, hubs=1, hub_options=HUB_OPTIONS, edge_options=lambda _: options) as running,
        ):
            (name,) = running.edges
            async with device_node(cp, tmp_path, name, port) as node:
                pod = web_pod("web", name)
                pod["spec"]["containers"][0]["image"] = image
                assert image not in node.images()

                spec = {"nodeNames": [name], "images": [image], "retryTimes": 1}
                await create_job(cp, "ImagePrePullJob", job, {"imagePrePullTemplate": spec})
                done = await job_when(cloud_kube, PREPULLS, job, settled, limit_s=90)
                assert done.status.phase is JobPhase.COMPLETED, done.status
                assert image in node.images()

                create(cp, namespace, pod)
                serving = await eventually(
                    "the pod of the pre-pulled image serving", lambda: serving_pod(cp, namespace, "web")
                )
                assert serving["page"] == node_images.WEB_PAGE.decode()
                (status,) = serving["status"]["containerStatuses"]
                assert status["image"] == image
    finally:
        cp.kubectl("delete", "namespace", namespace, "--wait=false")
        await anyio.to_thread.run_sync(registry.stop)
