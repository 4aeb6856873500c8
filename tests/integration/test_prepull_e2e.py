"""ImagePrePullJob end to end: controller, hub, real agent processes, real containerd and registries."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from structlog.testing import capture_logs

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube
from roles.kube.resources import SECRETS, job_resource
from schemas.core import Secret
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.meta import ObjectMeta
from tests.integration.agents import agent_command, write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import running_controller, running_hub
from tests.integration.objects import create_job, job_when, settled, unique
from tools.processes import terminate
from tools.provision.containerd import Containerd, Registry

pytestmark = pytest.mark.integration
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)


@asynccontextmanager
async def agents(commands: list[list[str]], log: Path) -> AsyncIterator[list[anyio.abc.Process]]:
    """Real agent processes writing their output (and their puller children's) to ``log``, stopped with
    SIGTERM (and checked to exit 0) at the end."""
    with log.open("ab") as out:
        processes = [await anyio.open_process(c, stdout=out, stderr=subprocess.STDOUT) for c in commands]
    try:
        yield processes
    finally:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for process in processes:
                    tg.start_soon(terminate, process)
    assert [p.returncode for p in processes] == [0] * len(processes)


async def test_images_are_pulled_through_cri_with_the_secrets_credentials_per_registry(
    crds: ControlPlane,
    cloud_kube: Kube,
    containerd: Containerd,
    registry: Registry,
    auth_registry: Registry,
    tmp_path: Path,
) -> None:
    """Agents pull open and authenticated images; without the Secret the private image fails; a bad one fails.

    The credentials travel typed from the hub to each agent's puller child, and no log line of the
    hub, the agents or their children shows the password.
    """
    public = registry.push(unique("public"))
    private = auth_registry.push(unique("private"))
    missing = f"{registry.host}/{unique('missing')}:1"
    secret_name = unique("pull-secret")
    async with admin(crds) as kube:
        dockerconfig = auth_registry.docker_config_json().encode()
        await kube.create(
            SECRETS,
            Secret(
                metadata=ObjectMeta(name=secret_name, namespace="kube-system"),
                type="kubernetes.io/dockerconfigjson",
                data={".dockerconfigjson": base64.b64encode(dockerconfig).decode()},
            ),
            namespace="kube-system",
        )
    nodes = [unique("cri") for _ in range(2)]
    tokens = await register_edges(crds, nodes)
    with_secret, without_secret, bad = unique("with"), unique("without"), unique("bad")

    def template(images: list[str], secret: str = "", only: list[str] | None = None) -> dict[str, object]:
        spec = {"nodeNames": only or nodes, "images": images, "concurrency": 2, "retryTimes": 1}
        return {"imagePrePullTemplate": {**spec, "imageSecrets": secret} if secret else spec}

    agent_log = tmp_path / "agents.log"
    with capture_logs() as hub_log:
        async with running_controller(crds), running_hub(crds, "hub-cri") as hub:
            commands = [
                agent_command(
                    write_agent_config(
                        tmp_path / n,
                        node=n,
                        token=tokens[n],
                        hub_urls=[hub.url],
                        criEndpoint=containerd.endpoint,
                        logLevel="debug",
                    )
                )
                for n in nodes
            ]
            async with agents(commands, agent_log):
                await create_job(
                    crds, "ImagePrePullJob", with_secret, template([public, private], f"kube-system/{secret_name}")
                )
                await create_job(crds, "ImagePrePullJob", without_secret, template([private], only=nodes[:1]))
                await create_job(crds, "ImagePrePullJob", bad, template([public, missing], only=nodes[:1]))
                done = {
                    name: await job_when(cloud_kube, PREPULLS, name, settled, limit_s=90)
                    for name in (with_secret, without_secret, bad)
                }

    job = done[with_secret]
    assert job.status.phase is JobPhase.COMPLETED
    for entry in job.status.node_status:
        assert [(i.image, i.status) for i in entry.image_status] == [(public, "True"), (private, "True")]

    anonymous = done[without_secret].status.node_status[0]
    assert anonymous.phase is NodeTaskPhase.FAILURE
    assert [(i.image, i.status) for i in anonymous.image_status] == [(private, "False")]
    assert anonymous.image_status[0].reason

    partial = done[bad].status.node_status[0]
    assert partial.phase is NodeTaskPhase.FAILURE
    assert [(i.image, i.status) for i in partial.image_status] == [(public, "True"), (missing, "False")]
    assert missing in partial.reason

    written = agent_log.read_text() + repr(hub_log)
    assert "image_pulled" in written  # the puller children's lines are there too
    assert auth_registry.password not in written
