"""The controller's autonomy approval and pod binding against the real API server, under the controller's RBAC.

There is no kubelet and no hub here: the test creates Nodes, and Pods already bound to them
(``spec.nodeName``), and writes each Node's ``Autonomy`` condition as a hub would. The Pods' namespace
(``default``) opts in to the binding while a test runs; ``CLOSED`` never does.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
import structlog

from flows.autonomy.toleration_binding import FOREVER, NOT_READY, ORIGINAL_ANNOTATIONS, UNREACHABLE
from nodetask.autonomy import AUTONOMY_ANNOTATION, BINDABLE_LABEL, CONDITION_TYPE, DURATION_ANNOTATION, STATUS_LABEL
from nodetask.clock import Clock
from roles.controller.autonomy.controller import AutonomyController
from roles.kube import ApiError, Kube, NotFound
from roles.kube.resources import NODES, PODS
from schemas.core import Node, Pod
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin
from tests.integration.objects import kubectl, polled, unique

pytestmark = pytest.mark.integration
NS = "default"
CLOSED = "autonomy-closed"
"""A namespace that does not opt in to the binding."""
INTERVAL = 0.2
"""The controller's binding interval where pacing is not what a test is about: changes are held briefly."""
SAVED_NOT_READY = ORIGINAL_ANNOTATIONS[NOT_READY]
SAVED_UNREACHABLE = ORIGINAL_ANNOTATIONS[UNREACHABLE]
DEFAULTS = [
    {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]
"""What the DefaultTolerationSeconds admission plugin gives a Pod without them."""


class Cluster:
    """One test's Nodes and Pods, made as an administrator and deleted afterwards."""

    def __init__(self, cp: ControlPlane, kube: Kube) -> None:
        self.cp = cp
        self.kube = kube
        self.nodes: list[str] = []
        self.pods: dict[str, list[str]] = {}
        """Names of the Pods made, by namespace."""
        self.daemon_sets: list[str] = []

    async def node(self, **annotations: str) -> str:
        name = unique("edge")
        await self.kube.create(NODES, Node(metadata=ObjectMeta(name=name, annotations=annotations)))
        self.nodes.append(name)
        return name

    async def annotate(self, node: str, annotations: dict[str, str | None]) -> None:
        await self.kube.merge_patch(NODES, node, {"metadata": {"annotations": annotations}})

    async def condition(self, node: str, status: str, reason: str) -> None:
        """The node's Autonomy condition, written on its status as its hub writes it."""
        condition = {"type": CONDITION_TYPE, "status": status, "reason": reason, "message": reason}
        condition["lastTransitionTime"] = Clock.start().stamp()
        await self.kube.merge_patch(NODES, node, {"status": {"conditions": [condition]}}, subresource="status")

    async def opt(self, namespace: str, *, bindable: bool) -> None:
        """Label ``namespace`` as opting in to the binding, or take the label off."""
        label = f"{BINDABLE_LABEL}=true" if bindable else f"{BINDABLE_LABEL}-"
        await kubectl(self.cp, "label", "namespace", namespace, label, "--overwrite")

    async def pod(
        self, node: str, *, tolerations: list[dict[str, Any]] | None = None, namespace: str = NS, **meta: Any
    ) -> Pod:
        """A Pod bound to ``node``, as a scheduler binds one (admission adds the default tolerations it lacks)."""
        name = unique("pod")
        spec: dict[str, Any] = {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox"}],
            "automountServiceAccountToken": False,
        }
        if tolerations is not None:
            spec["tolerations"] = tolerations
        doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta}, "spec": spec}
        created = await kubectl(self.cp, "create", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(doc))
        self.pods.setdefault(namespace, []).append(name)
        return msgspec.json.decode(created.stdout, type=Pod)  # as created: the controller may change it at once

    async def daemon_set(self) -> dict[str, str]:
        """A DaemonSet in NS (no controller makes its Pods here) as a Pod's owner reference: the owner must
        exist, or the garbage collector deletes the Pod."""
        name = unique("ds")
        labels = {"app": name}
        doc = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
            },
        }
        created = await kubectl(self.cp, "create", "-n", NS, "-f", "-", "-o", "json", input=json.dumps(doc))
        self.daemon_sets.append(name)
        uid = json.loads(created.stdout)["metadata"]["uid"]
        return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": uid}

    async def cleanup(self) -> None:
        for namespace, pods in self.pods.items():
            await kubectl(self.cp, "delete", "pod", "-n", namespace, "--grace-period=0", "--force", *pods)
        if self.daemon_sets:
            await kubectl(self.cp, "delete", "daemonset", "-n", NS, *self.daemon_sets)
        await self.opt(NS, bindable=False)
        for name in self.nodes:
            with contextlib.suppress(NotFound):
                await self.kube.delete(NODES, name)


@pytest.fixture
async def admin_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    async with admin(crds) as kube:
        yield kube


@pytest.fixture
async def cluster(crds: ControlPlane, admin_kube: Kube) -> AsyncIterator[Cluster]:
    await anyio.to_thread.run_sync(functools.partial(crds.kubectl, "create", "namespace", CLOSED, check=False))
    for namespace in (NS, CLOSED):
        # Pod admission wants the namespace's default ServiceAccount; the controller manager may not have made it yet.
        await anyio.to_thread.run_sync(
            functools.partial(crds.kubectl, "create", "serviceaccount", "default", "-n", namespace, check=False)
        )
    made = Cluster(crds, admin_kube)
    try:
        await made.opt(NS, bindable=True)
        yield made
    finally:
        await made.cleanup()


@asynccontextmanager
async def running(kube: Kube, *, interval: float = INTERVAL) -> AsyncIterator[AutonomyController]:
    """An autonomy controller, ready (every watch listed) on entry and stopped on exit."""
    controller = AutonomyController(
        kube=kube, clock=Clock.start(), log=structlog.get_logger(), binding_interval=interval
    )
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        yield controller
        tg.cancel_scope.cancel()


def label_is(value: str | None) -> Callable[[Node], bool]:
    return lambda node: node.metadata.labels.get(STATUS_LABEL) == value


async def node_when(kube: Kube, name: str, check: Callable[[Node], bool]) -> Node:
    return await polled(functools.partial(kube.get, NODES, name), check)


async def pod_when(kube: Kube, name: str, check: Callable[[Pod], bool], *, namespace: str = NS) -> Pod:
    return await polled(functools.partial(kube.get, PODS, name, namespace=namespace), check)


def tolerations(pod: Pod) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = msgspec.to_builtins(list(pod.spec.tolerations))
    return found


def seconds(pod: Pod) -> dict[str, int | None]:
    """The seconds of each of the two NoExecute tolerations the binding sets."""
    return {t.key: t.toleration_seconds for t in pod.spec.tolerations if t.key in (NOT_READY, UNREACHABLE)}


def saved(pod: Pod) -> dict[str, str]:
    return {k: v for k, v in pod.metadata.annotations.items() if k in ORIGINAL_ANNOTATIONS.values()}


def bound_to(value: int | None) -> Callable[[Pod], bool]:
    """The Pod's two tolerations have ``value`` seconds (None: none) and the originals are saved."""
    return lambda pod: seconds(pod) == {NOT_READY: value, UNREACHABLE: value} and bool(saved(pod))


async def writes(controller: AutonomyController, *, at_least: int) -> tuple[int, int]:
    """The controller's (label, pod) writes once they add up to ``at_least``: a write is counted when its
    answer is back, which can be after the test sees its effect."""

    async def fetch() -> tuple[int, int]:
        return controller.label_writes, controller.pod_writes

    return await polled(fetch, lambda counts: sum(counts) >= at_least)


async def pod_writes(controller: AutonomyController, *, at_least: int) -> int:
    """The controller's Pod writes once they are ``at_least`` (counted when each answer is back)."""

    async def fetch() -> int:
        return controller.pod_writes

    return await polled(fetch, lambda count: count >= at_least)


async def event_reasons(cp: ControlPlane, uid: str, *, until: str) -> list[str]:
    """The reasons of the Events about object ``uid`` once one says ``until``."""

    async def fetch() -> list[str]:
        selector = f"involvedObject.uid={uid}"
        listed = await kubectl(cp, "get", "events", "-n", NS, "--field-selector", selector, "-o", "json")
        # Not kube-controller-manager's own Events about Nodes (RegisteredNode, from its node controller).
        items = json.loads(listed.stdout)["items"]
        return [e["reason"] for e in items if (e.get("source") or {}).get("component") != "node-controller"]

    return await polled(fetch, lambda reasons: until in reasons)


async def test_the_api_server_changes_a_pod_s_toleration_seconds_but_never_drops_a_toleration(
    cluster: Cluster, admin_kube: Kube
) -> None:
    """What the binding is designed around (kube-apiserver 1.20): an existing toleration's seconds may be set,
    changed or removed; removing a toleration is refused (422), or undone by admission for the two defaults."""
    other = {"key": "example.com/other", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
    pod = await cluster.pod(await cluster.node(), tolerations=[other])
    assert tolerations(pod) == [other, *DEFAULTS]
    name = pod.metadata.name
    no_seconds = {k: v for k, v in DEFAULTS[1].items() if k != "tolerationSeconds"}
    for changed in ([other, {**DEFAULTS[0], "tolerationSeconds": 60}, no_seconds], [other, *DEFAULTS]):
        patched = await admin_kube.merge_patch(PODS, name, {"spec": {"tolerations": changed}}, namespace=NS)
        assert tolerations(patched) == changed
    with pytest.raises(ApiError, match="existing toleration can not be modified except its tolerationSeconds") as no:
        await admin_kube.merge_patch(PODS, name, {"spec": {"tolerations": DEFAULTS}}, namespace=NS)
    assert no.value.status == 422
    # DefaultTolerationSeconds admits updates too: a default toleration removed comes back with 300 s.
    patched = await admin_kube.merge_patch(PODS, name, {"spec": {"tolerations": [other, DEFAULTS[0]]}}, namespace=NS)
    assert tolerations(patched) == [other, *DEFAULTS]


async def test_the_approval_label_follows_the_autonomy_condition_and_goes_with_the_request(
    cluster: Cluster, controller_kube: Kube, admin_kube: Kube
) -> None:
    """Requested: "false" until the condition is True, "true" while it is, "false" when Unknown; removed when
    the request is withdrawn; a Node that never asked gets no label. Each change is an Event on the Node."""
    asking = await cluster.node(**{AUTONOMY_ANNOTATION: "true"})
    silent = await cluster.node()
    async with running(controller_kube):
        await node_when(admin_kube, asking, label_is("false"))
        await cluster.condition(asking, "True", "autonomy enabled successfully")
        await node_when(admin_kube, asking, label_is("true"))
        await cluster.condition(asking, "Unknown", "cache failed")
        await node_when(admin_kube, asking, label_is("false"))
        await cluster.condition(asking, "True", "autonomy enabled successfully")
        await node_when(admin_kube, asking, label_is("true"))
        await cluster.annotate(asking, {AUTONOMY_ANNOTATION: None, DURATION_ANNOTATION: "1d"})  # unparsable: no request
        done = await node_when(admin_kube, asking, label_is(None))
        assert STATUS_LABEL not in (await admin_kube.get(NODES, silent)).metadata.labels
    reasons = await event_reasons(cluster.cp, done.metadata.uid, until="AutonomyWithdrawn")
    assert sorted(reasons) == sorted(
        ["AutonomyDenied", "AutonomyApproved", "AutonomyDenied", "AutonomyApproved", "AutonomyWithdrawn"]
    )


async def test_pods_on_a_node_with_a_duration_tolerate_it_and_get_their_own_tolerations_back(
    cluster: Cluster, controller_kube: Kube, admin_kube: Kube
) -> None:
    """A 90s duration binds the Pods bound to the node (one of whose tolerations has no seconds), saving the
    originals; a Pod bound later too; forever removes the seconds; withdrawn, each Pod is exactly as it was.
    A DaemonSet Pod on the node and a Pod on another node are never touched."""
    node = await cluster.node(**{DURATION_ANNOTATION: "90s"})
    other = await cluster.node()
    no_seconds = [{"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"}]
    daemon = await cluster.daemon_set()
    plain = await cluster.pod(node)
    forever = await cluster.pod(node, tolerations=no_seconds)
    daemon_pod = await cluster.pod(node, ownerReferences=[daemon])
    elsewhere = await cluster.pod(other)
    originals = {p.metadata.name: tolerations(p) for p in (plain, forever)}
    assert originals[forever.metadata.name] == [no_seconds[0], DEFAULTS[1]]
    async with running(controller_kube):
        first = await pod_when(admin_kube, plain.metadata.name, bound_to(90))
        assert saved(first) == {SAVED_NOT_READY: "300", SAVED_UNREACHABLE: "300"}
        second = await pod_when(admin_kube, forever.metadata.name, bound_to(90))
        assert saved(second) == {SAVED_NOT_READY: FOREVER, SAVED_UNREACHABLE: "300"}
        later = await cluster.pod(node)
        await pod_when(admin_kube, later.metadata.name, bound_to(90))
        originals[later.metadata.name] = tolerations(later)

        await cluster.annotate(node, {DURATION_ANNOTATION: "0"})
        for name in originals:
            kept = await pod_when(admin_kube, name, bound_to(None))
            assert saved(kept)  # the first originals, not the 90s

        await cluster.annotate(node, {DURATION_ANNOTATION: None})
        for name, before in originals.items():
            restored = await pod_when(admin_kube, name, lambda pod: not saved(pod))
            assert tolerations(restored) == before
        untouched = [await admin_kube.get(PODS, p.metadata.name, namespace=NS) for p in (daemon_pod, elsewhere)]
    assert [p.metadata.resource_version for p in untouched] == [
        daemon_pod.metadata.resource_version,
        elsewhere.metadata.resource_version,
    ]


async def test_a_restarted_controller_rewrites_nothing_that_is_already_right(
    cluster: Cluster, controller_kube: Kube, admin_kube: Kube
) -> None:
    """After a restart the labels and bindings found right are left alone (same resourceVersions, no write),
    while a Pod bound after the restart is still bound: the new controller acts, only where needed."""
    approved = await cluster.node(**{AUTONOMY_ANNOTATION: "true"})
    await cluster.condition(approved, "True", "autonomy enabled successfully")
    timed = await cluster.node(**{DURATION_ANNOTATION: "45s"})
    pods = [await cluster.pod(timed), await cluster.pod(timed, tolerations=DEFAULTS[:1])]

    def bound(pod: Pod) -> bool:
        return set(seconds(pod).values()) == {45}

    async with running(controller_kube) as first:
        await node_when(admin_kube, approved, label_is("true"))
        await node_when(admin_kube, timed, label_is("false"))
        for pod in pods:
            await pod_when(admin_kube, pod.metadata.name, bound)
        assert await writes(first, at_least=4) == (2, 2)

    async def versions() -> list[str]:
        nodes = [await admin_kube.get(NODES, name) for name in (approved, timed)]
        bound_pods = [await admin_kube.get(PODS, p.metadata.name, namespace=NS) for p in pods]
        return [n.metadata.resource_version for n in nodes] + [p.metadata.resource_version for p in bound_pods]

    before = await versions()
    async with running(controller_kube) as second:
        assert second.due == 0  # everything listed was found right: no worker started
        sentinel = await cluster.pod(timed)
        await pod_when(admin_kube, sentinel.metadata.name, bound)
        assert await writes(second, at_least=1) == (0, 1)
        assert await versions() == before


async def test_a_pod_the_binding_cannot_restore_exactly_is_left_alone_with_one_warning(
    cluster: Cluster, controller_kube: Kube, admin_kube: Kube
) -> None:
    """Two not-ready tolerations with different seconds cannot be saved in one annotation: the Pod keeps them,
    gets one TolerationsNotBound Warning Event, and is not tried again while it does not change."""
    node = await cluster.node(**{DURATION_ANNOTATION: "30s"})
    mixed = [
        {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    ]
    refused = await cluster.pod(node, tolerations=mixed)
    async with running(controller_kube) as controller:
        await event_reasons(cluster.cp, refused.metadata.uid, until="TolerationsNotBound")
        # The node changes (its label with it) but its binding does not: the refused Pod is not tried again.
        await cluster.condition(node, "True", "autonomy enabled successfully")
        await node_when(admin_kube, node, label_is("true"))
        later = await cluster.pod(node)
        await pod_when(admin_kube, later.metadata.name, lambda pod: set(seconds(pod).values()) == {30})
        assert await writes(controller, at_least=3) == (2, 1)
    reasons = await event_reasons(cluster.cp, refused.metadata.uid, until="TolerationsNotBound")
    assert reasons == ["TolerationsNotBound"]
    assert tolerations(await admin_kube.get(PODS, refused.metadata.name, namespace=NS))[:2] == mixed


async def test_pods_in_a_namespace_that_does_not_opt_in_are_never_written(
    cluster: Cluster, controller_kube: Kube, admin_kube: Kube
) -> None:
    """Whoever patches a Node decides nothing for a namespace without the opt-in label: its Pod on the node keeps
    its resourceVersion through a 1s duration, forever and the withdrawal, while a Pod beside it in an opted-in
    namespace is bound each time. Opting in binds it; opting out gives it back exactly what it had."""
    node = await cluster.node(**{DURATION_ANNOTATION: "1s"})
    closed = await cluster.pod(node, namespace=CLOSED)
    sentinel = await cluster.pod(node)
    name = closed.metadata.name
    async with running(controller_kube):
        await pod_when(admin_kube, sentinel.metadata.name, bound_to(1))
        await cluster.annotate(node, {DURATION_ANNOTATION: "0"})
        await pod_when(admin_kube, sentinel.metadata.name, bound_to(None))
        await cluster.annotate(node, {DURATION_ANNOTATION: None})
        await pod_when(admin_kube, sentinel.metadata.name, lambda pod: not saved(pod))
        await cluster.annotate(node, {DURATION_ANNOTATION: "1s"})
        await pod_when(admin_kube, sentinel.metadata.name, bound_to(1))
        untouched = await admin_kube.get(PODS, name, namespace=CLOSED)
        assert untouched.metadata.resource_version == closed.metadata.resource_version

        await cluster.opt(CLOSED, bindable=True)
        try:
            await pod_when(admin_kube, name, bound_to(1), namespace=CLOSED)
        finally:
            await cluster.opt(CLOSED, bindable=False)
        restored = await pod_when(admin_kube, name, lambda pod: not saved(pod), namespace=CLOSED)
    assert tolerations(restored) == tolerations(closed)


async def test_a_flapping_duration_costs_each_pod_one_patch_per_interval_and_ends_on_its_last_value(
    cluster: Cluster, controller_kube: Kube, admin_kube: Kube
) -> None:
    """300 patches of one Node's duration (1s, forever, 2s, ..., then 45s) reach its Pods at most once per binding
    interval, so each Pod is patched at most 1 + T / interval times over the T seconds from the first patch
    to the last value seen on every Pod; that last value is the one they keep."""
    interval = 3.0
    node = await cluster.node(**{DURATION_ANNOTATION: "90s"})
    pods = [await cluster.pod(node) for _ in range(3)]
    async with running(controller_kube, interval=interval) as controller:
        for pod in pods:
            await pod_when(admin_kube, pod.metadata.name, bound_to(90))
        before = await pod_writes(controller, at_least=len(pods))
        start = anyio.current_time()
        for i in range(299):
            await cluster.annotate(node, {DURATION_ANNOTATION: ("1s", "0", "2s")[i % 3]})
        await cluster.annotate(node, {DURATION_ANNOTATION: "45s"})
        for pod in pods:
            final = await pod_when(admin_kube, pod.metadata.name, bound_to(45))
            assert saved(final) == {SAVED_NOT_READY: "300", SAVED_UNREACHABLE: "300"}
        patched = await pod_writes(controller, at_least=before + len(pods)) - before
        spent = anyio.current_time() - start
    assert patched <= len(pods) * (1 + spent / interval), f"{patched} Pod patches in {spent:.1f}s"
