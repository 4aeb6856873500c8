"""The Kubernetes access layer against a real kube-apiserver: CRDs, versions, watches, conflicts, errors."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import math
import os
import random
from pathlib import Path

import anyio
import msgspec
import pytest
import structlog
import trio
import trio_asyncio

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import (
    ApiError,
    Conflict,
    Kube,
    NotFound,
    Relisted,
    Resource,
    Unserved,
    Upserted,
    WatchEvent,
    crossing,
    open_kube,
)
from roles.kube.errors import Unreachable
from roles.kube.resources import EVENTS, LEASES, NODES, job_resource
from schemas import v1alpha2
from schemas.core import Event, Lease, LeaseSpec, Node, ObjectReference
from schemas.kinds import CONFIG_UPDATE_JOB, IMAGE_PRE_PULL_JOB, NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import create_job, kubectl, unique

pytestmark = pytest.mark.integration
UPGRADES = job_resource(NODE_UPGRADE_JOB)
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
UPDATES = job_resource(CONFIG_UPDATE_JOB)
DATA = Path(__file__).parent.parent / "data"


async def test_v1alpha1_object_reads_back_as_v1alpha2(crds: ControlPlane, controller_kube: Kube) -> None:
    """A v1alpha1 NodeUpgradeJob created with kubectl is served as v1alpha2 and decodes into its Struct."""
    name = unique("v1")
    manifest = (DATA / "kubeedge-nodeupgradejob-v1alpha1.yaml").read_text().replace("upgrade-example", name)
    # kubectl validates against the published schema and refuses the sample's dead fields; the API
    # server itself prunes them, which is what KubeEdge users rely on.
    await kubectl(crds, "create", "--validate=false", "-f", "-", input=manifest)
    job = await controller_kube.get(UPGRADES, name)
    assert isinstance(job, v1alpha2.NodeUpgradeJob)
    assert job.api_version == "operations.kubeedge.io/v1alpha2"
    assert job.spec.version == "v1.16.0"
    assert job.spec.concurrency == 2
    assert str(job.spec.failure_tolerate) == "0.3"
    assert job.status.phase is JobPhase.NONE


async def test_kubectl_shows_printer_columns(crds: ControlPlane, controller_kube: Kube) -> None:
    """`kubectl get nodeupgradejobs` shows phase and node counts written into status."""
    name = unique("cols")
    await create_job(crds, "NodeUpgradeJob", name, {"version": "v1.21.0", "nodeNames": ["a", "b"]})

    def mutate(job: v1alpha2.NodeUpgradeJob) -> v1alpha2.NodeUpgradeJob:
        status = v1alpha2.NodeUpgradeJobStatus(
            phase=JobPhase.IN_PROGRESS,
            node_status=(
                v1alpha2.NodeUpgradeJobNodeTaskStatus(node_name="a", phase=NodeTaskPhase.SUCCESSFUL),
                v1alpha2.NodeUpgradeJobNodeTaskStatus(node_name="b", phase=NodeTaskPhase.IN_PROGRESS),
            ),
            node_counts=v1alpha2.NodeCounts(total=2, successful=1, in_progress=1),
        )
        return msgspec.structs.replace(job, status=status)

    await controller_kube.update_status(UPGRADES, name, mutate)
    out = (await kubectl(crds, "get", "nodeupgradejobs", name)).stdout.split("\n")
    assert out[0].split() == ["NAME", "PHASE", "NODES", "RUNNING", "SUCCEEDED", "FAILED", "AGE"]
    assert out[1].split()[:6] == [name, "InProgress", "2", "1", "1", "0"]
    assert name in (await kubectl(crds, "get", "nodejobs")).stdout
    assert name in (await kubectl(crds, "get", "nuj")).stdout


async def test_concurrent_status_writers_never_lose_an_update(crds: ControlPlane, cloud_kube: Kube) -> None:
    """Twenty writers each set their own node entry at once; every change is present at the end."""
    name = unique("race")
    nodes = [f"n{i}" for i in range(20)]
    await create_job(
        crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["busybox"], "nodeNames": nodes}}
    )

    def init(job: v1alpha2.ImagePrePullJob) -> v1alpha2.ImagePrePullJob:
        entries = tuple(v1alpha2.ImagePrePullNodeTaskStatus(node_name=n, phase=NodeTaskPhase.PENDING) for n in nodes)
        return msgspec.structs.replace(
            job, status=v1alpha2.ImagePrePullJobStatus(phase=JobPhase.INIT, node_status=entries)
        )

    await cloud_kube.update_status(PREPULLS, name, init)

    def finish(node: str):  # type: ignore[no-untyped-def]
        def mutate(job: v1alpha2.ImagePrePullJob) -> v1alpha2.ImagePrePullJob | None:
            entries = tuple(
                msgspec.structs.replace(e, phase=NodeTaskPhase.SUCCESSFUL, reason=f"done by {node}")
                if e.node_name == node
                else e
                for e in job.status.node_status
            )
            return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, node_status=entries))

        return mutate

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for node in nodes:
                # Each round of conflicts lets at least one writer through: as many attempts as writers
                # always suffice, however the API server orders them (eight did not on a loaded machine).
                tg.start_soon(
                    functools.partial(cloud_kube.update_status, attempts=len(nodes)), PREPULLS, name, finish(node)
                )
    final = await cloud_kube.get(PREPULLS, name)
    assert [(e.node_name, e.phase, e.reason) for e in final.status.node_status] == [
        (n, NodeTaskPhase.SUCCESSFUL, f"done by {n}") for n in nodes
    ]
    assert cloud_kube.conflicts > 0, "the writers never collided: the test proved nothing"


async def test_a_stale_copy_given_to_update_status_costs_a_conflict_never_a_lost_change(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """Writing from an outdated copy is refused (409), re-read and re-applied; "no change" is re-checked fresh."""
    name = unique("stale")
    await create_job(crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["a/b:1"], "nodeNames": ["n"]}})
    stale = await cloud_kube.get(PREPULLS, name)

    def reason(text: str):  # type: ignore[no-untyped-def]
        def mutate(job: v1alpha2.ImagePrePullJob) -> v1alpha2.ImagePrePullJob | None:
            if job.status.reason == text:
                return None
            status = msgspec.structs.replace(job.status, reason=text, phase=JobPhase.INIT)
            return msgspec.structs.replace(job, status=status)

        return mutate

    await cloud_kube.update_status(PREPULLS, name, reason("first"))
    conflicts = cloud_kube.conflicts
    second = await cloud_kube.update_status(PREPULLS, name, reason("second"), current=stale)
    assert second is not None
    assert second.status.reason == "second"
    assert cloud_kube.conflicts == conflicts + 1
    # On the stale copy the reason is not yet "second", but the fresh object already has it: no write.
    writes = cloud_kube.writes
    unchanged = await cloud_kube.update_status(PREPULLS, name, reason("second"), current=stale)
    assert unchanged is not None
    assert unchanged.status.reason == "second"
    assert cloud_kube.writes == writes


async def test_watch_delivers_snapshot_then_changes_and_survives_an_apiserver_restart(
    crds: ControlPlane, controller_kube: Kube
) -> None:
    """A watch lists first, then streams changes; across an apiserver restart it relists and keeps going."""
    before, during = unique("w1"), unique("w2")
    await _create_prepull(crds, before)
    send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
    seen: set[str] = set()
    relists = 0

    async def wait_for(name: str) -> None:
        nonlocal relists
        async for event in receive:
            if isinstance(event, Relisted):
                relists += 1
                seen.update(o.metadata.name for o in event.objects)
            elif isinstance(event, Upserted):
                seen.add(event.obj.metadata.name)
            if name in seen:
                return

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg, send, receive:
            await tg.start(controller_kube.watch, PREPULLS, send)
            await wait_for(before)
            await anyio.to_thread.run_sync(crds.restart_apiserver)
            await _create_prepull(crds, during)
            await wait_for(during)
            tg.cancel_scope.cancel()
    assert relists >= 1


async def _create_prepull(cp: ControlPlane, name: str) -> None:
    await create_job(cp, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["busybox"], "nodeNames": ["x"]}})


async def test_invalid_object_is_reported_not_fatal(crds: ControlPlane, controller_kube: Kube) -> None:
    """An object that does not decode is listed as Invalid with the field path, and the rest still decodes."""
    bad = unique("bad")
    await create_job(crds, "NodeUpgradeJob", bad, {"version": "v1", "nodeNames": ["a"], "failureTolerate": "7"})
    valid, invalid, version = await controller_kube.list(UPGRADES)
    assert version
    assert bad in [i.name for i in invalid]
    assert "failureTolerate must be a number within [0, 1]" in next(i.error for i in invalid if i.name == bad)
    assert all(v.metadata.name != bad for v in valid)


async def test_errors_name_what_failed(crds: ControlPlane, controller_kube: Kube) -> None:
    """404 of an object is NotFound, of an unserved resource Unserved; a forbidden write names the verb, and an
    unreachable server is Unreachable."""
    with pytest.raises(NotFound, match=r"GET /apis/operations\.kubeedge\.io/v1alpha2/nodeupgradejobs/nope"):
        await controller_kube.get(UPGRADES, "nope")
    # What a restarting API server answers for a CRD it does not serve yet: says nothing of the object.
    # (As admin: the authorizer runs before routing, so the controller would get a 403.)
    ghosts = Resource("ghosts.nodetaskd.test/v1", "ghosts", Node)
    async with open_kube(kubeconfig=str(crds.kubeconfig("admin")), log=structlog.get_logger()) as admin:
        with pytest.raises(Unserved, match="page not found") as unserved:
            await admin.get(ghosts, "nope")
    assert not isinstance(unserved.value, NotFound)
    with pytest.raises(ApiError, match="403 Forbidden"):
        await controller_kube.create(NODES, Node(metadata=ObjectMeta(name=unique("node"))))
    async with open_kube(kubeconfig=str(_dead_kubeconfig(crds)), log=structlog.get_logger()) as dead:
        with pytest.raises(Unreachable, match="GET /api/v1/nodes"):
            await dead.list(NODES)


def _dead_kubeconfig(cp: ControlPlane) -> Path:
    text = cp.kubeconfig("admin").read_text()
    path = cp.state_dir / "dead.kubeconfig"
    path.write_text(text.replace(cp.server, "https://127.0.0.1:9"))
    return path


async def _start_and_cancel_watches(kube: Kube, cycles: int) -> None:
    rng = random.Random(4)
    for cycle in range(cycles):
        send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
        async with send, receive, anyio.create_task_group() as tg:
            if cycle % 2:
                tg.start_soon(kube.watch, PREPULLS, send)
                await anyio.sleep(rng.uniform(0, 0.02))  # cancelled anywhere: mid-list, mid-watch
            else:
                await tg.start(kube.watch, PREPULLS, send)
                tg.start_soon(kube.list, PREPULLS)
            tg.cancel_scope.cancel()


async def test_watch_soak_start_cancel_leaves_no_task_behind(crds: ControlPlane, controller_kube: Kube) -> None:
    """Two hundred watch start/cancel cycles, half cancelled mid-call, all unwind: no trio or asyncio task is left."""
    await _start_and_cancel_watches(controller_kube, 2)  # warm the connection pool first
    # Each pooled keep-alive connection keeps a reader task; kubernetes-asyncio pools at most 5 per
    # CPU (10 here). A leak per cancelled watch would exceed this bound a hundredfold.
    pool = 10
    tasks_before = trio.lowlevel.current_statistics().tasks_living + pool
    aio_before = await trio_asyncio.aio_as_trio(_asyncio_tasks)() + pool
    with anyio.fail_after(240):
        await _start_and_cancel_watches(controller_kube, 200)
    # Stopped asyncio calls unwind asynchronously, within crossing.STOP_GRACE_S at worst; a leak is a
    # count that never comes back down.
    with anyio.fail_after(crossing.STOP_GRACE_S + 5):
        while True:
            trio_tasks = trio.lowlevel.current_statistics().tasks_living
            aio_tasks = await trio_asyncio.aio_as_trio(_asyncio_tasks)()
            if trio_tasks <= tasks_before and aio_tasks <= aio_before:
                break
            await anyio.sleep(0.1)


async def test_cancelled_watches_release_their_sockets(crds: ControlPlane, controller_kube: Kube) -> None:
    """Cancelled watches give their sockets back to the system."""
    fds_before = len(os.listdir("/proc/self/fd"))
    with anyio.fail_after(120):
        await _start_and_cancel_watches(controller_kube, 100)
    # As above: stopped asyncio calls close their sockets within crossing.STOP_GRACE_S at worst.
    with anyio.move_on_after(crossing.STOP_GRACE_S + 5):
        while True:
            gc.collect()
            fds = _open_fds()
            if len(fds) <= fds_before + 5:
                break
            await anyio.sleep(0.1)
    assert len(fds) <= fds_before + 5, collections.Counter(f.split(":")[0] for f in fds)


def _open_fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


async def _asyncio_tasks() -> int:
    return len(asyncio.all_tasks())


async def test_merge_patch_events_and_leases(crds: ControlPlane, controller_kube: Kube) -> None:
    """A conditional merge patch adds a finalizer (409 when stale), and Events and Leases can be written."""
    name = unique("mp")
    await create_job(crds, "ConfigUpdateJob", name, {"nodeNames": ["a"], "updateFields": {"a.b": "1"}})
    job = await controller_kube.get(UPDATES, name)
    patched = await controller_kube.merge_patch(
        UPDATES,
        name,
        {
            "metadata": {
                "finalizers": ["kubeedge.io/configupdatejob-controller"],
                "resourceVersion": job.metadata.resource_version,
            }
        },
    )
    assert patched.metadata.finalizers == ("kubeedge.io/configupdatejob-controller",)
    with pytest.raises(Conflict):
        await controller_kube.merge_patch(
            UPDATES, name, {"metadata": {"finalizers": [], "resourceVersion": job.metadata.resource_version}}
        )
    await controller_kube.merge_patch(UPDATES, name, {"metadata": {"finalizers": None}})
    event = Event(
        metadata=ObjectMeta(name=f"{name}.1", namespace="default"),
        involved_object=ObjectReference(
            api_version="operations.kubeedge.io/v1alpha2", kind="ConfigUpdateJob", name=name, uid=job.metadata.uid
        ),
        reason="JobInit",
        message="selected 1 node",
        first_timestamp="2026-11-25T10:00:00Z",
        last_timestamp="2026-11-25T10:00:00Z",
    )
    created = await controller_kube.create(EVENTS, event, namespace="default")
    assert created.reason == "JobInit"
    assert "selected 1 node" in (await kubectl(crds, "describe", "configupdatejob", name)).stdout
    lease = await controller_kube.create(
        LEASES,
        Lease(
            metadata=ObjectMeta(name=name, namespace="kube-system"),
            spec=LeaseSpec(holder_identity="a", lease_duration_seconds=15),
        ),
        namespace="kube-system",
    )
    renewed = await controller_kube.replace(
        LEASES, msgspec.structs.replace(lease, spec=msgspec.structs.replace(lease.spec, holder_identity="b"))
    )
    assert renewed.spec.holder_identity == "b"
    with pytest.raises(Conflict):
        await controller_kube.replace(LEASES, lease)


async def test_forbidden_watch_logs_once_and_backs_off_without_busy_looping(crds: ControlPlane) -> None:
    """A watch the identity may not make is logged as a warning once, then retried at debug level, ever slower."""
    with structlog.testing.capture_logs() as logs:
        async with open_kube(kubeconfig=str(crds.kubeconfig("edge")), log=structlog.get_logger()) as kube:
            send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
            async with send, receive, anyio.create_task_group() as tg:
                tg.start_soon(kube.watch, PREPULLS, send)
                await anyio.sleep(4)
                tg.cancel_scope.cancel()
    failures = [e for e in logs if e["event"] == "watch_failed"]
    assert 2 <= len(failures) <= 6, failures
    assert [e["log_level"] for e in failures] == ["warning"] + ["debug"] * (len(failures) - 1)
    assert all("403 Forbidden" in e["error"] and e["resource"] == PREPULLS.plural for e in failures)
    delays = [e["retry_in_s"] for e in failures]
    assert max(delays) > delays[0]
