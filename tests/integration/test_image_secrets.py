"""Registry Secrets for pre-pulls come only from the namespaces the hubs allow, under the cloud role's real RBAC."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from nodetask.phases import JobPhase
from roles.common.registry_auth import RegistryAuth
from roles.edge.actions import AuthFor
from roles.kube import ApiError, Kube
from roles.kube.resources import SECRETS, job_resource
from schemas.core import Secret
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.meta import ObjectMeta
from schemas.v1alpha2 import ImageStatus
from tests.integration.agents import FakeRuntime, running_agent
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import running_controller, running_hub
from tests.integration.objects import create_job, job_when, settled, unique

pytestmark = pytest.mark.integration
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
IMAGE = "registry.local:5000/team/app:1"


class RecordingRuntime(FakeRuntime):
    """A runtime that records the credentials each image would be pulled with."""

    def __init__(self) -> None:
        super().__init__()
        self.auths: dict[str, RegistryAuth | None] = {}

    async def pull(self, images: tuple[str, ...], retry_times: int, auth_for: AuthFor) -> tuple[ImageStatus, ...]:
        self.auths.update({image: auth_for(image) for image in images})
        return await super().pull(images, retry_times, auth_for)


async def registry_secret(crds: ControlPlane, namespace: str) -> str:
    """A ``.dockerconfigjson`` Secret for registry.local:5000 in ``namespace``; its name."""
    name = unique("regcred")
    config = {"auths": {"registry.local:5000": {"username": "puller", "password": "s3cret"}}}
    data = {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}
    secret = Secret(
        metadata=ObjectMeta(name=name, namespace=namespace), type="kubernetes.io/dockerconfigjson", data=data
    )
    async with admin(crds) as kube:
        await kube.create(SECRETS, secret, namespace=namespace)
    return name


def _prepull(node: str, secret: str) -> dict[str, object]:
    return {"imagePrePullTemplate": {"nodeNames": [node], "images": [IMAGE], "imageSecrets": secret}}


async def test_the_cloud_role_reads_secrets_in_kube_system_only(crds: ControlPlane, cloud_kube: Kube) -> None:
    """The shipped RBAC lets the hubs get a Secret in kube-system, and no longer one in any other namespace."""
    allowed, other = await registry_secret(crds, "kube-system"), await registry_secret(crds, "default")
    assert (await cloud_kube.get(SECRETS, allowed, namespace="kube-system")).metadata.name == allowed
    with pytest.raises(ApiError) as refused:
        await cloud_kube.get(SECRETS, other, namespace="default")
    assert refused.value.status == 403


async def test_a_job_naming_a_secret_elsewhere_fails_with_the_reason_and_one_in_kube_system_is_used(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """With no webhook to refuse it, the hub still refuses a foreign namespace, saying why in the node status."""
    node = unique("secrets")
    tokens = await register_edges(crds, [node])
    foreign, allowed = unique("prepull-foreign"), unique("prepull-allowed")
    foreign_secret = f"default/{await registry_secret(crds, 'default')}"
    allowed_secret = f"kube-system/{await registry_secret(crds, 'kube-system')}"
    runtime = RecordingRuntime()
    async with (
        running_controller(crds),
        running_hub(crds, "hub-secrets") as hub,
        running_agent(node, tokens[node], hub.url, tmp_path, runtime),
    ):
        await create_job(crds, "ImagePrePullJob", foreign, _prepull(node, foreign_secret))
        refused = await job_when(cloud_kube, PREPULLS, foreign, settled)
        await create_job(crds, "ImagePrePullJob", allowed, _prepull(node, allowed_secret))
        used = await job_when(cloud_kube, PREPULLS, allowed, settled)
    assert refused.status.phase is JobPhase.FAILURE
    entry = refused.status.node_status[0]
    assert entry.reason == (
        f"imageSecrets {foreign_secret}: the hubs read image secrets only in kube-system"
        " (their imageSecretNamespaces setting)"
    )
    assert [(i.image, i.status, i.reason) for i in entry.image_status] == [(IMAGE, "False", entry.reason)]
    assert used.status.phase is JobPhase.COMPLETED
    assert runtime.pulls == 1  # only the allowed job's
    assert runtime.auths == {IMAGE: RegistryAuth(registry="registry.local:5000", username="puller", password="s3cret")}
