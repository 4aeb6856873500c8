"""The controller role against the real API server: finalizer, selection, phases, timeouts, deletion."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog

import roles.controller.role as controller_role
from flows.nodejobs import decide
from nodetask.clock import Clock
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.common.config import ControllerConfig
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import Kube, NotFound
from roles.kube.resources import job_resource
from schemas.kinds import IMAGE_PRE_PULL_JOB, KINDS, NODE_UPGRADE_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import create_job, job_when, kubectl, unique

pytestmark = pytest.mark.integration
UPGRADES = job_resource(NODE_UPGRADE_JOB)
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)


async def _node(cp: ControlPlane, name: str, *, edge: bool = True, ready: bool = True) -> None:
    labels = {"node-role.kubernetes.io/edge": ""} if edge else {}
    await kubectl(
        cp,
        "create",
        "-f",
        "-",
        input=msgspec.json.encode(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        ).decode(),
    )
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "Test",
                    "message": "set by the test",
                }
            ]
        }
    }
    await kubectl(
        cp, "patch", "node", name, "--subresource=status", "--type=merge", "-p", msgspec.json.encode(status).decode()
    )


@pytest.fixture
async def controller(crds: ControlPlane, controller_kube: Kube) -> AsyncIterator[Reconciler]:
    """A running controller authenticated as the controller role."""
    reconciler = Reconciler(kube=controller_kube, clock=Clock.start(), log=structlog.get_logger(), kinds=KINDS)
    async with anyio.create_task_group() as tg:
        await tg.start(reconciler.run)
        yield reconciler
        tg.cancel_scope.cancel()


async def test_job_gets_finalizer_nodes_and_progresses(
    crds: ControlPlane, controller: Reconciler, cloud_kube: Kube
) -> None:
    """A new job gets the finalizer, its nodes with KubeEdge's reasons, InProgress, then Completed from hub results."""
    ok1, ok2, cloud, down = (unique(p) for p in ("edge", "edge", "cloud", "down"))
    await _node(crds, ok1)
    await _node(crds, ok2)
    await _node(crds, cloud, edge=False)
    await _node(crds, down, ready=False)
    name = unique("pp")
    await create_job(
        crds,
        "ImagePrePullJob",
        name,
        {
            "imagePrePullTemplate": {
                "images": ["busybox"],
                "nodeNames": [ok1, ok2, cloud, down, ok1],
                "failureTolerate": "0.5",
            }
        },
    )
    job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
    assert job.metadata.finalizers == ("kubeedge.io/imageprepulljob-controller",)
    assert [(e.node_name, e.phase, e.reason) for e in job.status.node_status] == [
        (ok1, NodeTaskPhase.PENDING, ""),
        (ok2, NodeTaskPhase.PENDING, ""),
        (cloud, NodeTaskPhase.FAILURE, decide.NOT_EDGE),
        (down, NodeTaskPhase.FAILURE, decide.NOT_READY),
    ]

    def hub_finishes(j: Any) -> Any:  # what a hub would write for its nodes
        entries = tuple(
            msgspec.structs.replace(e, phase=NodeTaskPhase.SUCCESSFUL) if e.phase is NodeTaskPhase.PENDING else e
            for e in j.status.node_status
        )
        return msgspec.structs.replace(j, status=msgspec.structs.replace(j.status, node_status=entries))

    await cloud_kube.update_status(PREPULLS, name, hub_finishes)
    done = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert done.status.node_counts.successful == 2
    assert done.status.node_counts.failure == 2
    # The controller records JobCompleted just after the status write seen above.
    with anyio.fail_after(20):
        while True:
            described = (await kubectl(crds, "describe", "imageprepulljob", name)).stdout
            if "JobCompleted" in described:
                break
            await anyio.sleep(0.1)
    assert "NodeTaskFailed" in described


async def test_selection_errors_fail_the_job(crds: ControlPlane, controller: Reconciler, cloud_kube: Kube) -> None:
    """Neither nodeNames nor labelSelector: the job fails at once with KubeEdge's reason."""
    name = unique("none")
    await create_job(crds, "NodeUpgradeJob", name, {"version": "v1.21.0"})
    job = await job_when(cloud_kube, UPGRADES, name, lambda j: j.status.phase is JobPhase.FAILURE)
    assert job.status.reason == decide.NO_SELECTOR


async def test_unconnected_node_times_out(crds: ControlPlane, controller: Reconciler, cloud_kube: Kube) -> None:
    """A Pending node no hub holds becomes Unknown after timeoutSeconds, and the job fails."""
    node, name = unique("lonely"), unique("to")
    await _node(crds, node)
    await create_job(
        crds,
        "ImagePrePullJob",
        name,
        {"imagePrePullTemplate": {"images": ["busybox"], "nodeNames": [node], "timeoutSeconds": 2}},
    )
    job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.FAILURE, limit_s=20)
    assert job.status.node_status[0].phase is NodeTaskPhase.UNKNOWN
    assert job.status.node_status[0].reason == decide.NOT_CONNECTED


async def test_invalid_job_fails_with_the_field_named(crds: ControlPlane, controller: Reconciler) -> None:
    """A job whose spec does not decode is failed with a reason naming the field."""
    name = unique("bad")
    await create_job(crds, "NodeUpgradeJob", name, {"version": "v1", "nodeNames": ["a"], "failureTolerate": "3"})
    with anyio.fail_after(20):
        while True:
            out = (await kubectl(crds, "get", "nodeupgradejob", name, "-o", "jsonpath={.status.reason}")).stdout
            if out:
                break
            await anyio.sleep(0.2)
    assert "failureTolerate must be a number within [0, 1]" in out


async def test_deleted_job_loses_its_finalizer_and_goes(
    crds: ControlPlane, controller: Reconciler, cloud_kube: Kube
) -> None:
    """Deleting a job removes the controller's finalizer, so the object disappears."""
    node, name = unique("edge"), unique("del")
    await _node(crds, node)
    await create_job(crds, "NodeUpgradeJob", name, {"version": "v1.21.0", "nodeNames": [node]})
    await job_when(cloud_kube, UPGRADES, name, lambda j: bool(j.metadata.finalizers))
    await kubectl(crds, "delete", "nodeupgradejob", name, "--wait=false")
    with anyio.fail_after(20):
        while True:
            try:
                await cloud_kube.get(UPGRADES, name)
            except NotFound:
                break
            await anyio.sleep(0.2)


async def test_feature_gate_disables_the_v1alpha2_controllers(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """With disableNodeTaskV1alpha2 the controller role leaves jobs alone (KubeEdge compatibility)."""
    name = unique("gated")
    await create_job(crds, "NodeUpgradeJob", name, {"version": "v1.21.0", "nodeNames": ["a"]})
    cfg = ControllerConfig(
        kubeconfig=str(crds.kubeconfig("controller")),
        feature_gates=("disableNodeTaskV1alpha2",),
        lease_name=unique("gated-lease"),
        listen_host="127.0.0.1",
        webhook_port=0,
        metrics_port=0,
        cert_dir=str(tmp_path),
    )
    with anyio.move_on_after(3):
        await controller_role.run(cfg, log=structlog.get_logger())
    job = await cloud_kube.get(UPGRADES, name)
    assert job.metadata.finalizers == ()
    assert job.status.phase is JobPhase.NONE
