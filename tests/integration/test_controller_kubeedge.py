"""Counterparts of KubeEdge's controller-manager tests not already covered by test_controller.py.

Each test names the KubeEdge test it mirrors (``cloud/pkg/controllermanager/nodetask/``). Where
nodetaskd deliberately differs (docs/decisions.md, "Node jobs"), the test asserts nodetaskd's
behaviour and says so: node timeouts count from dispatch; duplicate node names are dropped.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
import pytest
import structlog

from flows.nodejobs import decide, imageprepulljob, nodeupgradejob
from flows.nodejobs.jobtype import JobType, apply_result
from nodetask.clock import Clock, format_time, parse_time
from nodetask.messages import ActionResult
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import Kube, Upserted, WatchEvent, open_kube
from roles.kube.resources import NODES, job_resource
from schemas import v1alpha2
from schemas.core import EDGE_ROLE_LABEL, HUB_ANNOTATION, Node
from schemas.kinds import IMAGE_PRE_PULL_JOB, KINDS, NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import job_when, kubectl, unique

pytestmark = pytest.mark.integration
UPGRADES = job_resource(NODE_UPGRADE_JOB)
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
LOG = structlog.get_logger()
HOLD = "test.nodetask.kubeedge.io/hold"


@pytest.fixture
async def admin_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    """A cluster-admin client, for setting up nodes."""
    async with open_kube(kubeconfig=str(crds.kubeconfig("admin")), log=LOG) as kube:
        yield kube


@pytest.fixture
async def controller(crds: ControlPlane, controller_kube: Kube) -> AsyncIterator[Reconciler]:
    """A running controller authenticated as the controller role."""
    reconciler = Reconciler(kube=controller_kube, clock=Clock.start(), log=LOG, kinds=KINDS)
    async with anyio.create_task_group() as tg:
        await tg.start(reconciler.run)
        yield reconciler
        tg.cancel_scope.cancel()


async def node(kube: Kube, name: str, *, edge: bool = True, ready: bool = True, hub: str = "", **labels: str) -> None:
    """A Node as a kubelet (or KubeEdge's edgecore) registers it; ``hub`` holds its session."""
    meta = ObjectMeta(
        name=name,
        labels={**labels, **({EDGE_ROLE_LABEL: ""} if edge else {})},
        annotations={HUB_ANNOTATION: hub} if hub else {},
    )
    await kube.create(NODES, Node(metadata=meta))
    condition = {"type": "Ready", "status": "True" if ready else "False", "reason": "Test", "message": "test"}
    await kube.merge_patch(NODES, name, {"status": {"conditions": [condition]}}, subresource="status")


async def create(
    cp: ControlPlane, kind: str, name: str, spec: dict[str, object], *, finalizers: Sequence[str] = ()
) -> None:
    """Create a v1alpha2 job as a user would, optionally with finalizers of its own."""
    meta: dict[str, object] = {"name": name, **({"finalizers": list(finalizers)} if finalizers else {})}
    doc = {"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": kind, "metadata": meta, "spec": spec}
    await kubectl(cp, "create", "-f", "-", input=msgspec.json.encode(doc).decode())


def on_node(node_name: str, change: Callable[[Any], Any]) -> Callable[[Any], Any | None]:
    """A hub's status mutation of one node's entry."""

    def mutate(job: Any) -> Any | None:
        entries = tuple(change(e) if e.node_name == node_name else e for e in job.status.node_status)
        if entries == job.status.node_status:
            return None
        return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, node_status=entries))

    return mutate


def dispatch(at: str) -> Callable[[Any], Any]:
    return lambda e: msgspec.structs.replace(e, phase=NodeTaskPhase.IN_PROGRESS, dispatch_time=at)


def report(job_type: JobType, result: ActionResult) -> Callable[[Any], Any]:
    return lambda e: apply_result(job_type, e, result, now=result.finish_time) or e


def stamp() -> str:
    return format_time(datetime.now(UTC))


async def test_passes_add_the_finalizer_then_initialise_then_calculate(
    crds: ControlPlane, controller: Reconciler, admin_kube: Kube
) -> None:
    """Mirrors reconcile_runner_test: a new job gets only the finalizer, then Init, then the calculated phase."""
    n, name = unique("edge"), unique("steps")
    await node(admin_kube, n)
    send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
    seen: list[tuple[bool, JobPhase]] = []
    async with send, receive, anyio.create_task_group() as tg:
        await tg.start(admin_kube.watch, UPGRADES, send)
        await create(crds, "NodeUpgradeJob", name, {"version": "v1.21.0", "nodeNames": [n]})
        with anyio.fail_after(15):
            async for event in receive:
                if isinstance(event, Upserted) and event.obj.metadata.name == name:
                    step = (bool(event.obj.metadata.finalizers), event.obj.status.phase)
                    if not seen or seen[-1] != step:
                        seen.append(step)
                    if step[1] is JobPhase.IN_PROGRESS:
                        break
        tg.cancel_scope.cancel()
    assert seen == [
        (False, JobPhase.NONE),
        (True, JobPhase.NONE),  # AddFinalizer only: no status in the same pass
        (True, JobPhase.INIT),  # InitNodesStatus + UpdateJobStatus, no CalculateStatus
        (True, JobPhase.IN_PROGRESS),  # CalculateStatus on the next pass: Pending counts as processing
    ]


async def test_an_initialised_job_is_resumed_not_selected_again(
    crds: ControlPlane, controller_kube: Kube, cloud_kube: Kube
) -> None:
    """Mirrors the handler tests' NotInitialized (only phase "" is initialised): a new controller keeps the entries."""
    n, gone, name = unique("edge"), unique("gone"), unique("resume")
    await create(
        crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["busybox"], "nodeNames": [n, gone]}}
    )
    entries = tuple(v1alpha2.ImagePrePullNodeTaskStatus(node_name=x, phase=NodeTaskPhase.PENDING) for x in (n, gone))

    def earlier_controller(job: Any) -> Any:  # what a previous instance wrote before it stopped
        status = msgspec.structs.replace(job.status, phase=JobPhase.INIT, node_status=entries)
        return msgspec.structs.replace(job, status=status)

    await cloud_kube.update_status(PREPULLS, name, earlier_controller)
    reconciler = Reconciler(kube=controller_kube, clock=Clock.start(), log=LOG, kinds=KINDS)
    async with anyio.create_task_group() as tg:
        await tg.start(reconciler.run)
        job = await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
        tg.cancel_scope.cancel()
    # Selected afresh, the node that does not exist would have failed with "failed to get node".
    assert [(e.node_name, e.phase, e.reason) for e in job.status.node_status] == [
        (n, NodeTaskPhase.PENDING, ""),
        (gone, NodeTaskPhase.PENDING, ""),
    ]
    assert job.metadata.finalizers == ("kubeedge.io/imageprepulljob-controller",)


async def test_selection_by_label_and_by_names_explains_each_node(
    crds: ControlPlane, controller: Reconciler, admin_kube: Kube, cloud_kube: Kube
) -> None:
    """Mirrors node_verify_test: by selector in name order with the edge/ready checks; a missing name fails."""
    zone = unique("zone")
    a, b, c = (f"{zone}-{x}" for x in "abc")
    await node(admin_kube, c, zone=zone)
    await node(admin_kube, a, ready=False, zone=zone)
    await node(admin_kube, b, edge=False, zone=zone)
    by_label, by_name, nothing = unique("sel"), unique("names"), unique("none")
    await create(
        crds, "NodeUpgradeJob", by_label, {"version": "v1.21.0", "labelSelector": {"matchLabels": {"zone": zone}}}
    )
    await create(crds, "NodeUpgradeJob", by_name, {"version": "v1.21.0", "nodeNames": [c, "ghost-" + zone]})
    await create(
        crds, "NodeUpgradeJob", nothing, {"version": "v1.21.0", "labelSelector": {"matchLabels": {"zone": "mars"}}}
    )
    selected = await job_when(cloud_kube, UPGRADES, by_label, lambda j: j.status.phase is not JobPhase.NONE)
    assert [(e.node_name, e.phase, e.reason) for e in selected.status.node_status] == [
        (a, NodeTaskPhase.FAILURE, decide.NOT_READY),
        (b, NodeTaskPhase.FAILURE, decide.NOT_EDGE),
        (c, NodeTaskPhase.PENDING, ""),
    ]
    named = await job_when(cloud_kube, UPGRADES, by_name, lambda j: j.status.phase is not JobPhase.NONE)
    assert [(e.node_name, e.phase, e.reason) for e in named.status.node_status] == [
        (c, NodeTaskPhase.PENDING, ""),
        ("ghost-" + zone, NodeTaskPhase.FAILURE, f'failed to get node, err: nodes "ghost-{zone}" not found'),
    ]
    none = await job_when(cloud_kube, UPGRADES, nothing, lambda j: j.status.phase is JobPhase.FAILURE)
    assert (none.status.reason, none.status.node_status) == (decide.NO_MATCH, ())


async def test_silent_dispatched_node_times_out_at_dispatch_plus_timeout(
    crds: ControlPlane, controller: Reconciler, admin_kube: Kube, cloud_kube: Kube
) -> None:
    """Mirrors CheckTimeout (8 s of 10: unchanged; 10: Unknown), counted from dispatch (KubeEdge: last report)."""
    n, name = unique("edge"), unique("silent")
    await node(admin_kube, n, hub="hub-1")  # connected: queued, it would never time out
    await create(
        crds,
        "ImagePrePullJob",
        name,
        {"imagePrePullTemplate": {"images": ["x"], "nodeNames": [n], "timeoutSeconds": 3}},
    )
    await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
    at = stamp()
    await cloud_kube.update_status(PREPULLS, name, on_node(n, dispatch(at)))
    due = parse_time(at) + timedelta(seconds=3)
    # The upper bound leaves room for a loaded machine: the controller's wake-up, its GET and PUT, and this GET.
    with anyio.fail_after(15):
        while True:
            job = await cloud_kube.get(PREPULLS, name)
            now = datetime.now(UTC)
            if job.status.node_status[0].phase is not NodeTaskPhase.IN_PROGRESS:
                break
            assert now < due + timedelta(seconds=5), "the node was not timed out at its deadline"
            await anyio.sleep(0.1)
    assert now >= due
    entry = job.status.node_status[0]
    assert (entry.phase, entry.reason, entry.dispatch_time) == (NodeTaskPhase.UNKNOWN, decide.TIMED_OUT, at)
    assert (job.status.phase, job.status.node_counts) == (JobPhase.FAILURE, v1alpha2.NodeCounts(total=1, unknown=1))


async def test_late_result_revives_a_failed_upgrade_but_not_a_failed_prepull(
    crds: ControlPlane, controller: Reconciler, admin_kube: Kube, cloud_kube: Kube
) -> None:
    """Mirrors IsFinalPhase (NodeUpgradeJob Failure is not final, ImagePrePullJob's is) and "final ⇒ no calc"."""
    n, upgrade, prepull = unique("edge"), unique("up"), unique("pp")
    await node(admin_kube, n, hub="hub-1")
    await create(crds, "NodeUpgradeJob", upgrade, {"version": "v1.21.0", "nodeNames": [n], "timeoutSeconds": 1})
    await create(
        crds,
        "ImagePrePullJob",
        prepull,
        {"imagePrePullTemplate": {"images": ["x"], "nodeNames": [n], "timeoutSeconds": 1}},
    )
    long_ago = format_time(datetime.now(UTC) - timedelta(minutes=1))
    for resource, name in ((UPGRADES, upgrade), (PREPULLS, prepull)):
        await job_when(cloud_kube, resource, name, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
        await cloud_kube.update_status(resource, name, on_node(n, dispatch(long_ago)))
        failed = await job_when(cloud_kube, resource, name, lambda j: j.status.phase is JobPhase.FAILURE)
        assert failed.status.node_status[0].reason == decide.TIMED_OUT
    # The node's final report arrives after its timeout (a slow device, a hub reconnecting).
    finished = (
        (UPGRADES, upgrade, nodeupgradejob.JOB_TYPE, "Upgrade", "v1.20.0,v1.21.0"),
        (PREPULLS, prepull, imageprepulljob.JOB_TYPE, "Pull", imageprepulljob.encode_extend(())),
    )
    for resource, name, job_type, action, extend in finished:
        result = ActionResult(action=action, succ=True, finish_time=stamp(), extend=extend)
        await cloud_kube.update_status(resource, name, on_node(n, report(job_type, result)))
    revived = await job_when(cloud_kube, UPGRADES, upgrade, lambda j: j.status.phase is JobPhase.COMPLETED)
    assert (revived.status.node_status[0].phase, revived.status.node_status[0].reason) == (NodeTaskPhase.SUCCESSFUL, "")
    assert revived.status.reason == ""
    # The node counts shown to users follow the revival (nodetaskd's addition). The controller
    # recounts in the same pass that would have (wrongly) recalculated the phase, so once the counts
    # show, that pass has run.
    revived_counts = v1alpha2.NodeCounts(total=1, successful=1)
    stays = await job_when(cloud_kube, PREPULLS, prepull, lambda j: j.status.node_counts == revived_counts)
    assert stays.status.node_status[0].phase is NodeTaskPhase.SUCCESSFUL  # the hub's write stands
    assert stays.status.phase is JobPhase.FAILURE  # the final phase is not recalculated (KubeEdge)


async def test_deleting_a_job_removes_only_our_finalizer_and_stops_calculating(
    crds: ControlPlane, controller: Reconciler, admin_kube: Kube, cloud_kube: Kube
) -> None:
    """Mirrors reconcile_runner_test "deleted ⇒ no calc" and RemoveFinalizer: another finalizer stays."""
    n, name = unique("edge"), unique("del")
    await node(admin_kube, n)
    await create(
        crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["x"], "nodeNames": [n]}}, finalizers=[HOLD]
    )
    await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
    await kubectl(crds, "delete", "imageprepulljob", name, "--wait=false")
    await job_when(
        cloud_kube, PREPULLS, name, lambda j: j.metadata.deletion_timestamp and j.metadata.finalizers == (HOLD,)
    )
    await cloud_kube.update_status(
        PREPULLS, name, on_node(n, lambda e: msgspec.structs.replace(e, phase=NodeTaskPhase.SUCCESSFUL))
    )
    await anyio.sleep(1.5)  # time for the controller to have (wrongly) calculated Completed
    job = await cloud_kube.get(PREPULLS, name)
    assert (job.status.phase, job.status.node_status[0].phase) == (JobPhase.IN_PROGRESS, NodeTaskPhase.SUCCESSFUL)
    await kubectl(crds, "patch", "imageprepulljob", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
