"""Two controllers under leader election against the real API server: one acts, the other takes over.

Each instance is wired as the controller role wires it: an elector, a fresh reconciler per term, metrics.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
import structlog
import trio_asyncio
from prometheus_client import CollectorRegistry

from nodetask.clock import Clock
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.controller.leader import Elector
from roles.controller.metrics import ControllerMetrics
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import Kube, NotFound, crossing, open_kube
from roles.kube.aio import AioApi
from roles.kube.client import REQUESTS_IN_FLIGHT
from roles.kube.resources import EVENTS, LEASES, NODES, TASKS, job_resource
from schemas.core import EDGE_ROLE_LABEL, Node
from schemas.kinds import IMAGE_PRE_PULL_JOB, KINDS
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import create_job, job_when, unique

pytestmark = pytest.mark.integration
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
LEASE_S = 6
"""Long enough that a loaded machine still renews within the renew deadline (two thirds of it)."""
NAMESPACE = "kube-system"
LOG = structlog.get_logger()


@pytest.fixture
async def admin_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    """A cluster-admin client, for setting up nodes and reading Events."""
    async with open_kube(kubeconfig=str(crds.kubeconfig("admin")), log=LOG) as kube:
        yield kube


@pytest.fixture
async def second_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    """A second controller-role client: each instance counts its own writes."""
    async with open_kube(kubeconfig=str(crds.kubeconfig("controller")), log=LOG) as kube:
        yield kube


class Instance:
    """One controller instance: an elector and, per term, a fresh reconciler."""

    def __init__(self, kube: Kube, *, lease: str, identity: str, release: bool = True) -> None:
        self.kube = kube
        self.elector = Elector(
            kube, name=lease, namespace=NAMESPACE, identity=identity, duration=LEASE_S, log=LOG, release=release
        )
        self.reconcilers: list[Reconciler] = []
        self.registry = CollectorRegistry()
        self.metrics = ControllerMetrics(self.registry, kube=kube, leader=self.elector)

    async def work(self) -> None:
        """One term's work, wired as the controller role wires it."""
        reconciler = Reconciler(
            kube=self.kube,
            clock=Clock.start(),
            log=LOG.bind(identity=self.elector.identity),
            kinds=KINDS,
            on_reconciled=self.metrics.observe_reconcile,
        )
        self.reconcilers.append(reconciler)
        with self.metrics.tracking(reconciler):
            await reconciler.run()

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(f"nodetaskd_controller_{name}", labels)

    @property
    def reconciles(self) -> int:
        return sum(r.reconciles for r in self.reconcilers)


async def edge_nodes(kube: Kube, *names: str) -> None:
    """Ready edge nodes, as the tests in test_controller.py make them, through the API (faster than kubectl)."""
    for name in names:
        await kube.create(NODES, Node(metadata=ObjectMeta(name=name, labels={EDGE_ROLE_LABEL: ""})))
        ready = {"type": "Ready", "status": "True", "reason": "Test", "message": "set by the test"}
        await kube.merge_patch(NODES, name, {"status": {"conditions": [ready]}}, subresource="status")


async def until(check: Callable[[], bool], limit_s: float = 15) -> float:
    """Wait for ``check()``; returns the loop time when it held."""
    with anyio.fail_after(limit_s):
        while True:
            if check():
                return anyio.current_time()
            await anyio.sleep(0.05)


async def prepull(crds: ControlPlane, name: str, nodes: list[str]) -> None:
    await create_job(
        crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["busybox"], "nodeNames": nodes}}
    )


async def hub_finishes(kube: Kube, name: str) -> None:
    """What a hub writes when every Pending node of the job succeeded."""

    def mutate(job: Any) -> Any:
        entries = tuple(
            msgspec.structs.replace(e, phase=NodeTaskPhase.SUCCESSFUL) if e.phase is NodeTaskPhase.PENDING else e
            for e in job.status.node_status
        )
        return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, node_status=entries))

    await kube.update_status(PREPULLS, name, mutate)


async def event_reasons(kube: Kube, job: str) -> Counter[str]:
    events, _, _ = await kube.list(EVENTS, namespace="default")
    return Counter(e.reason for e in events if e.involved_object.name == job)


async def recorded(kube: Kube, job: str, reason: str) -> Counter[str]:
    """The job's Event reasons once ``reason`` is among them: the controller records it just after its status write."""
    with anyio.fail_after(20):
        while True:
            reasons = await event_reasons(kube, job)
            if reasons[reason] >= 1:
                return reasons
            await anyio.sleep(0.1)


async def test_exactly_one_of_two_controllers_acts(
    crds: ControlPlane, controller_kube: Kube, second_kube: Kube, admin_kube: Kube
) -> None:
    """Two controllers started together: one wins the lease and does all the work, the other writes nothing."""
    lease = unique("lease")
    a = Instance(controller_kube, lease=lease, identity="a")
    b = Instance(second_kube, lease=lease, identity="b")
    node, name = unique("edge"), unique("one")
    await edge_nodes(admin_kube, node)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.elector.lead, a.work)
        tg.start_soon(b.elector.lead, b.work)
        await until(lambda: a.elector.is_leader or b.elector.is_leader)
        leader, follower = (a, b) if a.elector.is_leader else (b, a)
        await prepull(crds, name, [node])
        await job_when(admin_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
        await hub_finishes(admin_kube, name)
        await job_when(admin_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.COMPLETED)
        await anyio.sleep(LEASE_S)  # several renewals, during which the follower keeps out
        assert leader.elector.is_leader
        assert not follower.elector.is_leader
        assert (leader.metric("leader"), follower.metric("leader")) == (1, 0)
        assert (leader.metric("jobs", kind="ImagePrePullJob", phase="Completed") or 0) >= 1
        assert follower.metric("jobs", kind="ImagePrePullJob", phase="Completed") is None
        assert (leader.metric("reconcile_duration_seconds_count", kind="ImagePrePullJob") or 0) >= 3
        assert (leader.metric("api_writes_total") or 0) >= 4  # finalizer, init, phases, lease renewals
        assert follower.metric("api_writes_total") == 0
        tg.cancel_scope.cancel()
    assert leader.reconciles > 0
    assert (follower.reconciles, follower.reconcilers, follower.kube.writes) == (0, [], 0)
    held = await admin_kube.get(LEASES, lease, namespace=NAMESPACE)
    assert held.spec.lease_transitions is None  # one holder all along (now released)
    assert held.spec.holder_identity is None


async def test_killed_leader_is_replaced_within_the_lease_duration(
    crds: ControlPlane, controller_kube: Kube, second_kube: Kube, admin_kube: Kube
) -> None:
    """A leader killed without releasing is replaced once its lease runs out, and no job is processed twice."""
    lease = unique("lease")
    a = Instance(controller_kube, lease=lease, identity="a", release=False)
    b = Instance(second_kube, lease=lease, identity="b")
    n1, n2, before, during = unique("edge"), unique("edge"), unique("before"), unique("during")
    await edge_nodes(admin_kube, n1, n2)
    async with anyio.create_task_group() as tg:
        a_scope = anyio.CancelScope()

        async def run_a(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            with a_scope:
                await a.elector.term(a.work, task_status=task_status)

        await tg.start(run_a)
        tg.start_soon(b.elector.lead, b.work)
        await prepull(crds, before, [n1, n2])
        await job_when(admin_kube, PREPULLS, before, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
        await recorded(admin_kube, before, "JobInProgress")
        a_scope.cancel()  # a kill: no release, the lease names a until it runs out
        killed = anyio.current_time()
        await prepull(crds, during, [n1])  # created while nobody leads
        await hub_finishes(admin_kube, before)
        # Nobody may act before a's lease can have run out (a renewed at most a third of it before the kill).
        await anyio.sleep_until(killed + LEASE_S * 2 / 3 - 0.2)
        orphan = await admin_kube.get(PREPULLS, during)
        took_over = await until(lambda: b.elector.is_leader, limit_s=LEASE_S + 3)
        done = await job_when(admin_kube, PREPULLS, before, lambda j: j.status.phase is JobPhase.COMPLETED)
        later = await job_when(admin_kube, PREPULLS, during, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
        reasons_before = await recorded(admin_kube, before, "JobCompleted")
        reasons_during = await recorded(admin_kube, during, "JobInProgress")
        tg.cancel_scope.cancel()
    # a renewed at most one renew interval (a third of the lease) before the kill, and b counts from when it saw that.
    assert LEASE_S * 2 / 3 <= took_over - killed <= LEASE_S + 1.5
    assert (orphan.metadata.finalizers, orphan.status.phase) == ((), JobPhase.NONE)
    assert [e.node_name for e in done.status.node_status] == [n1, n2]
    assert done.metadata.finalizers == ("kubeedge.io/imageprepulljob-controller",)
    assert done.status.node_counts is not None
    assert done.status.node_counts.successful == 2
    assert [e.node_name for e in later.status.node_status] == [n1]
    assert reasons_before == {"JobInit": 1, "JobInProgress": 1, "JobCompleted": 1}
    assert reasons_during == {"JobInit": 1, "JobInProgress": 1}
    assert a.reconciles > 0
    assert b.reconciles > 0
    held = await admin_kube.get(LEASES, lease, namespace=NAMESPACE)
    assert held.spec.lease_transitions == 1


async def test_released_lease_is_taken_over_at_once(
    crds: ControlPlane, controller_kube: Kube, second_kube: Kube
) -> None:
    """A leader shut down cleanly releases the lease, and the follower leads within one retry period."""
    lease = unique("lease")
    a = Instance(controller_kube, lease=lease, identity="a")
    b = Instance(second_kube, lease=lease, identity="b")
    async with anyio.create_task_group() as tg:
        a_scope = anyio.CancelScope()

        async def run_a(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            with a_scope:
                await a.elector.term(anyio.sleep_forever, task_status=task_status)

        await tg.start(run_a)
        # No reconciling: this is about the lease, and re-listing every job other tests left would only load the loop.
        tg.start_soon(b.elector.lead, anyio.sleep_forever)
        await anyio.sleep(1.5)
        assert not b.elector.is_leader
        a_scope.cancel()
        stopped = anyio.current_time()
        took_over = await until(lambda: b.elector.is_leader, limit_s=LEASE_S)
        tg.cancel_scope.cancel()
    # Without the release, b would wait for the lease to run out: at least two thirds of it.
    assert took_over - stopped < LEASE_S / 2
    held = await second_kube.get(LEASES, lease, namespace=NAMESPACE)
    assert held.spec.lease_transitions == 1


@asynccontextmanager
async def held_task_requests(crds: ControlPlane) -> AsyncIterator[tuple[Kube, anyio.Event, list[str]]]:
    """A controller-role client whose Task requests wait until the event is set before they go out (an API
    server slow to answer a stage's creates and deletes), and the paths of those waiting."""
    release = anyio.Event()
    waiting: list[str] = []
    async with trio_asyncio.open_loop() as loop:
        cross = crossing.bound(loop)
        api = await cross(AioApi.connect, str(crds.kubeconfig("controller")))

        async def held(fn: Any, *args: Any, **kwargs: Any) -> Any:
            path = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            if "/tasks" in path:
                waiting.append(path)
                await release.wait()
            return await cross(fn, *args, **kwargs)

        try:
            yield Kube(api, log=LOG, cross=held), release, waiting
        finally:
            release.set()
            with anyio.CancelScope(shield=True):
                await cross(api.close)


async def test_a_lease_is_renewed_while_task_requests_fill_every_shared_slot(
    crds: ControlPlane, admin_kube: Kube
) -> None:
    """Twice as many Task deletes as the client sends at once, none answered for 1.5 lease durations (past the
    renew deadline): the leader renews its Lease meanwhile and its term goes on (before, renewals queued behind
    the deletes, the term was cancelled and a new one relisted everything)."""
    lease = unique("held-lease")
    async with held_task_requests(crds) as (kube, release, waiting):
        elector = Elector(
            kube, name=lease, namespace=NAMESPACE, identity="held", duration=LEASE_S, log=LOG, release=False
        )
        worked = anyio.Event()

        async def delete(name: str) -> None:
            with contextlib.suppress(NotFound):
                await kube.delete(TASKS, name, namespace="default")

        async with anyio.create_task_group() as tg:

            async def work() -> None:
                # Leading: now the deletes take every shared slot, for longer than the renew deadline.
                for i in range(2 * REQUESTS_IN_FLIGHT):
                    tg.start_soon(delete, f"{lease}-{i}")
                await until(lambda: len(waiting) == REQUESTS_IN_FLIGHT)
                await anyio.sleep(1.5 * LEASE_S)
                worked.set()

            with anyio.fail_after(4 * LEASE_S):
                await elector.term(work)
            assert len(waiting) == REQUESTS_IN_FLIGHT  # still stuck: every renewal went past them
            release.set()
    assert worked.is_set()
    held = await admin_kube.get(LEASES, lease, namespace=NAMESPACE)
    assert held.spec.holder_identity == "held"
    assert held.spec.renew_time != held.spec.acquire_time
