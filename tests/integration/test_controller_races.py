"""The controller and hubs write one job status at once: the controller never loses a hub's result."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from typing import Any

import anyio
import msgspec
import pytest
import structlog

from flows.nodejobs import decide, nodeupgradejob
from flows.nodejobs.jobtype import apply_result
from nodetask.clock import Clock, format_time
from nodetask.messages import ActionResult
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import Kube, open_kube
from roles.kube.resources import EVENTS, NODES, job_resource
from schemas import v1alpha2
from schemas.core import EDGE_ROLE_LABEL, HUB_ANNOTATION, Node
from schemas.kinds import KINDS, NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import create_job, job_when, unique

pytestmark = pytest.mark.integration
UPGRADES = job_resource(NODE_UPGRADE_JOB)
LOG = structlog.get_logger()
CONNECTED = 18
SILENT = 12
HUB_TASKS = 6
RESULTS = (("Check", ""), ("BackUp", ""), ("Upgrade", "v1.20.0,v1.21.0"))


@pytest.fixture
async def admin_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    """A cluster-admin client, for setting up nodes."""
    async with open_kube(kubeconfig=str(crds.kubeconfig("admin")), log=LOG) as kube:
        yield kube


async def edge_nodes(kube: Kube, names: Sequence[str], *, hub: str = "") -> None:
    """Ready edge nodes; with ``hub``, a hub holds their sessions, so they are never timed out while queued."""
    for name in names:
        annotations = {HUB_ANNOTATION: hub} if hub else {}
        meta = ObjectMeta(name=name, labels={EDGE_ROLE_LABEL: ""}, annotations=annotations)
        await kube.create(NODES, Node(metadata=meta))
        ready = {"type": "Ready", "status": "True", "reason": "Test", "message": "set by the test"}
        await kube.merge_patch(NODES, name, {"status": {"conditions": [ready]}}, subresource="status")


def on_entry(node: str, change: Callable[[Any], Any | None]) -> Callable[[Any], Any | None]:
    """A status mutation that changes one node's entry, as a hub's status writer does."""

    def mutate(job: Any) -> Any | None:
        entries = list(job.status.node_status)
        i = entries.index(entry_of(job, node))
        new = change(entries[i])
        if new is None:
            return None
        entries[i] = new
        return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, node_status=tuple(entries)))

    return mutate


def entry_of(job: Any, node: str) -> Any:
    [entry] = [e for e in job.status.node_status if e.node_name == node]
    return entry


def marked_unknown(node: str) -> Callable[[Any], bool]:
    return lambda job: bool(entry_of(job, node).phase is NodeTaskPhase.UNKNOWN)


def dispatched(at: str) -> Callable[[Any], Any | None]:
    def change(entry: Any) -> Any | None:
        if entry.phase is not NodeTaskPhase.PENDING:
            return None
        return msgspec.structs.replace(entry, phase=NodeTaskPhase.IN_PROGRESS, dispatch_time=at)

    return change


def reported(result: ActionResult, now: str) -> Callable[[Any], Any | None]:
    def change(entry: Any) -> Any | None:
        return apply_result(nodeupgradejob.JOB_TYPE, entry, result, now=now)

    return change


async def hub(kube: Kube, job: str, nodes: Sequence[str], clock: Clock, recorded: dict[str, list[str]]) -> None:
    """Dispatch each node and write its three results, one status write each, as fast as the API allows.

    Every other node is dispatched "30 s ago", past its 1 s timeout, so the controller marks it
    Unknown while its results are still arriving: both sides then write the same entry. The first
    such node waits for that timeout before its results, so the overlap happens however fast the
    hub is; the rest race it.
    """
    for k, node in enumerate(nodes):
        at = format_time(clock.now() - timedelta(seconds=30 if k % 2 else 0))
        await kube.update_status(UPGRADES, job, on_entry(node, dispatched(at)), attempts=100)
        if k == 1:
            await job_when(kube, UPGRADES, job, marked_unknown(node))
        recorded[node] = []
        for action, extend in RESULTS:
            result = ActionResult(action=action, succ=True, finish_time=clock.stamp(), extend=extend)
            await kube.update_status(UPGRADES, job, on_entry(node, reported(result, clock.stamp())), attempts=100)
            recorded[node].append(action)


async def test_controller_never_overwrites_concurrent_hub_results(
    crds: ControlPlane, controller_kube: Kube, cloud_kube: Kube, admin_kube: Kube
) -> None:
    """While hubs write results at full speed and the controller times nodes out, no hub result is lost."""
    connected = [unique("hubbed") for _ in range(CONNECTED)]
    silent = [unique("silent") for _ in range(SILENT)]
    anchor = unique("anchor")  # held back until the hubs are done, so the job cannot end early
    await edge_nodes(admin_kube, [*connected, anchor], hub="hub-1")
    await edge_nodes(admin_kube, silent)
    name = unique("race")
    spec = {"version": "v1.21.0", "nodeNames": [*connected, *silent, anchor], "timeoutSeconds": 1}
    await create_job(crds, "NodeUpgradeJob", name, {**spec, "failureTolerate": "0.5"})
    clock = Clock.start()
    reconciler = Reconciler(kube=controller_kube, clock=clock, log=LOG, kinds=KINDS)
    recorded: dict[str, list[str]] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(reconciler.run)
        await job_when(cloud_kube, UPGRADES, name, lambda j: j.status.phase is not JobPhase.NONE)
        async with anyio.create_task_group() as hubs:
            for i in range(HUB_TASKS):
                hubs.start_soon(hub, cloud_kube, name, connected[i::HUB_TASKS], clock, recorded)
        await hub(cloud_kube, name, [anchor], clock, recorded)
        # A hub result may revive a timed-out node after the job completed: the counts catch up.
        expected = v1alpha2.NodeCounts(total=CONNECTED + SILENT + 1, successful=CONNECTED + 1, unknown=SILENT)
        done = await job_when(
            cloud_kube,
            UPGRADES,
            name,
            lambda j: j.status.phase is JobPhase.COMPLETED and j.status.node_counts == expected,
        )
        tg.cancel_scope.cancel()
    entries = {e.node_name: e for e in done.status.node_status}
    assert len(recorded) == CONNECTED + 1
    assert len(entries) == len(done.status.node_status) == CONNECTED + SILENT + 1
    for node, actions in recorded.items():
        entry = entries[node]
        assert [a.action for a in entry.action_flow] == actions == ["Check", "BackUp", "Upgrade"], node
        assert (entry.phase, entry.reason, entry.current_version) == (NodeTaskPhase.SUCCESSFUL, "", "v1.21.0"), node
        assert entry.dispatch_time, node
    for node in silent:
        assert (entries[node].phase, entries[node].reason) == (NodeTaskPhase.UNKNOWN, decide.NOT_CONNECTED)
    # Without conflicts on the controller's side the writes never interleaved and this proved nothing;
    # nor without the controller timing out entries the hubs were still writing.
    assert controller_kube.conflicts > 0, (controller_kube.conflicts, cloud_kube.conflicts)
    events, _, _ = await admin_kube.list(EVENTS, namespace="default")
    timed_out = {
        e.message.split(":")[0].removeprefix("node ")
        for e in events
        if e.involved_object.name == name and e.reason == "NodeTaskTimedOut"
    }
    assert timed_out & set(connected), timed_out
