"""The controller's side of edge autonomy: the approval label on Nodes, and the pod binding.

Namespaces, Nodes and the Pods bound to a node (``spec.nodeName`` set) are watched into caches;
every event is decided at once by the pure rules (:mod:`flows.autonomy.approval`,
:mod:`flows.autonomy.toleration_binding`, :mod:`flows.autonomy.binding_pace`), and only an object with something to
write gets a worker (one per object, serial), which decides again on the newest copy before writing.
Nothing is written before every watch has listed, so no Pod is ever restored because its Node had
not been seen yet, and a restarted controller that finds everything right writes nothing.

A Node's binding reaches its Pods at most once per ``binding_interval`` (a change seen sooner is
held, and the Node's binding when the interval ends is applied; a worker per node holding one looks
again then), and only Pods in namespaces that opt in are held to it: a Pod anywhere else is held to
no binding. So whoever may patch Nodes decides nothing about other namespaces' Pods, and flapping an
annotation costs at most one patch of each bound Pod per node and interval.

Writes are patches of what is owned: the one label (a merge patch of ``metadata.labels``), and a
Pod's tolerations with the two saved-originals annotations (conditional on the Pod's
resourceVersion; a 409 waits for the newer copy's event). What cannot be done is said once per Pod
version, as a Warning Event on the Pod and a log line, and not tried again until the Pod changes:
a Pod the rules refuse, or a change the API server refuses (422).
"""

from __future__ import annotations

import anyio
import anyio.abc
import structlog

from flows.autonomy.approval import label_change
from flows.autonomy.binding_pace import Pace, paced
from flows.autonomy.toleration_binding import (
    NOT_BOUND,
    NOT_RESTORED,
    Binding,
    BoundPod,
    Refusal,
    binding_for,
    bound_pod,
    opted_in,
    rebind,
)
from nodetask.clock import Clock
from nodetask.names import clip
from roles.common.events import object_event, record_event
from roles.controller.keyed import KeyedWorkers
from roles.controller.watches import Watch, follow
from roles.kube import ApiError, Conflict, Deleted, Invalid, Kube, Relisted, Upserted, WatchEvent
from roles.kube.resources import NAMESPACES, NODES, PODS
from roles.kube.versions import revision
from schemas.core import Node
from schemas.meta import ObjectMeta

__all__ = ["AutonomyController"]

Log = structlog.typing.FilteringBoundLogger
PodKey = tuple[str, str]
"""(namespace, name) of a Pod."""
COMPONENT = "nodetaskd-controller"
BOUND_PODS = "spec.nodeName!="
"""The pod watch's field selector: Pods not bound to a node yet are none of the binding's business."""


def _version(meta: ObjectMeta | BoundPod) -> int:
    return revision(meta.resource_version)


class AutonomyController:
    """Labels the Nodes that ask for autonomy and binds their Pods' tolerations. Run :meth:`run` in a task group."""

    def __init__(self, *, kube: Kube, clock: Clock, log: Log, binding_interval: float) -> None:
        self._kube = kube
        self._clock = clock
        self._log = log.bind(controller="autonomy")
        self._interval = binding_interval
        self._bindable: set[str] = set()
        """Namespaces whose Pods opt in to the binding."""
        self._nodes: dict[str, Node] = {}
        self._paces: dict[str, Pace] = {}
        """Per node (seen, or with Pods still bound to it), the binding its Pods are held to."""
        self._pods: dict[PodKey, BoundPod] = {}
        self._pods_on: dict[str, set[PodKey]] = {}
        """Pods by the node they are bound to."""
        self._refused: dict[PodKey, tuple[str, Binding | None]] = {}
        """Per Pod, the version and the binding last refused: said once, not tried again until either changes."""
        self._ready = anyio.Event()
        self._labels: KeyedWorkers[str]
        self._bindings: KeyedWorkers[PodKey]
        self._held: KeyedWorkers[str]
        """Per node with a change of binding held back, a worker that looks again when it may apply."""
        self.due = 0
        """Objects found with something to write (a worker started or poked), since start."""
        self.label_writes = 0
        self.pod_writes = 0
        self.binding_changes = 0
        """Changes of a node's applied binding, since start."""

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch and act until cancelled; ready once every watch's first list has been taken in."""
        async with anyio.create_task_group() as tg:
            self._labels = KeyedWorkers(tg, self._label_pass, ready=self._ready, log=self._log, what="autonomy label")
            self._bindings = KeyedWorkers(tg, self._pod_pass, ready=self._ready, log=self._log, what="pod binding")
            self._held = KeyedWorkers(tg, self._held_pass, ready=self._ready, log=self._log, what="held binding")
            watches = (
                Watch(NAMESPACES, self._on_namespace),
                Watch(NODES, self._on_node),
                Watch(PODS, self._on_pod, field_selector=BOUND_PODS),
            )
            await follow(tg, self._kube, watches, on_invalid=self._log_invalid)
            self._ready.set()
            task_status.started()

    async def _log_invalid(self, kind: str, event: Invalid) -> None:
        self._log.warning("undecodable_object", kind=kind, name=event.name, error=clip(event.error))

    # ------------------------------------------------------------------------------------------ caches

    def _on_namespace(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                bindable = {ns.metadata.name for ns in objects if opted_in(ns.metadata.labels)}
                changed, self._bindable = bindable ^ self._bindable, bindable
                self._check_namespaces(changed)
            case Upserted(obj=namespace):
                self._opt(namespace.metadata.name, bindable=opted_in(namespace.metadata.labels))
            case Deleted(obj=namespace):
                self._opt(namespace.metadata.name, bindable=False)

    def _opt(self, namespace: str, *, bindable: bool) -> None:
        if bindable == (namespace in self._bindable):
            return
        if bindable:
            self._bindable.add(namespace)
        else:
            self._bindable.discard(namespace)
        self._check_namespaces({namespace})

    def _check_namespaces(self, namespaces: set[str]) -> None:
        # Rare (a namespace opting in or out): a walk over the cached Pods costs less than keeping an index.
        if namespaces:
            for key in [k for k in self._pods if k[0] in namespaces]:
                self._check_pod(key)

    def _on_node(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                seen = self._nodes.keys() | self._paces.keys()
                self._nodes = {n.metadata.name: n for n in objects}
                for node in self._nodes.values():
                    self._check_label(node)
                for name in seen | self._nodes.keys():
                    self._pace(name)
                for key in self._pods:
                    self._check_pod(key)
            case Upserted(obj=node):
                name = node.metadata.name
                before = self._nodes.get(name)
                if before is not None and _version(before.metadata) > _version(node.metadata):
                    return  # older than the copy a write of ours returned
                self._nodes[name] = node
                self._check_label(node)
                self._pace(name)
            case Deleted(obj=node):
                self._nodes.pop(node.metadata.name, None)
                self._pace(node.metadata.name)

    def _on_pod(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                self._pods, self._pods_on = {}, {}
                for pod in objects:
                    self._store_pod(bound_pod(pod))
                self._refused = {k: v for k, v in self._refused.items() if k in self._pods}
                for key in self._pods:
                    self._check_pod(key)
                for name in [n for n in self._paces if n not in self._nodes]:
                    self._pace(name)  # deleted nodes whose Pods went unseen: their paces may go
            case Upserted(obj=pod):
                stored = self._store_pod(bound_pod(pod))
                if stored is not None:
                    self._check_pod(stored)
            case Deleted(obj=pod):
                gone = (pod.metadata.namespace, pod.metadata.name)
                view = self._pods.pop(gone, None)
                if view is not None:
                    on_node = self._pods_on.get(view.node, set())
                    on_node.discard(gone)
                    if not on_node:
                        self._pods_on.pop(view.node, None)
                        if view.node not in self._nodes:
                            self._pace(view.node)  # the last Pod of a deleted node: its pace may go
                self._refused.pop(gone, None)

    def _store_pod(self, pod: BoundPod) -> PodKey | None:
        """Cache ``pod`` unless the cache holds a newer copy; its key, or None when not stored."""
        key = (pod.namespace, pod.name)
        cached = self._pods.get(key)
        if cached is not None and _version(cached) > _version(pod):
            return None
        self._pods[key] = pod
        self._pods_on.setdefault(pod.node, set()).add(key)
        return key

    def _pace(self, name: str) -> None:
        if self._repace(name) is not None:
            self._held.poke(name)

    def _repace(self, name: str) -> float | None:
        """Apply node ``name``'s binding if its pace allows, re-checking its Pods when the one they are held to
        changes; the loop time to look again (a change held back), or None."""
        before = self._paces.get(name)
        wanted = binding_for(self._nodes.get(name))
        pace, again = paced(before, wanted, now=anyio.current_time(), interval=self._interval)
        if name not in self._nodes and pace.applied is None and again is None and name not in self._pods_on:
            # A deleted node with no Pods left: nothing to hold to a pace (a Pod bound to the name later
            # is written once, whatever the pace).
            self._paces.pop(name, None)
            return None
        self._paces[name] = pace
        held_to = None if before is None else before.applied
        if pace.applied != held_to:
            self.binding_changes += 1
            if before is not None:  # a first sight (a start, a new Node) is no change worth a line per node
                pods = len(self._pods_on.get(name, ()))
                if pace.applied is None:
                    self._log.info("autonomy_binding_withdrawn", node=name, pods=pods)
                else:
                    seconds = "forever" if pace.applied.seconds is None else pace.applied.seconds
                    self._log.info("autonomy_binding_changed", node=name, seconds=seconds, pods=pods)
            for key in self._pods_on.get(name, ()):
                self._check_pod(key)
        return again

    def _binding(self, pod: BoundPod) -> Binding | None:
        """What ``pod`` is held to: its node's applied binding when its namespace opts in, else none."""
        if pod.namespace not in self._bindable:
            return None
        pace = self._paces.get(pod.node)
        return None if pace is None else pace.applied

    def _check_label(self, node: Node) -> None:
        if label_change(node) is not None:
            self.due += 1
            self._labels.poke(node.metadata.name)

    def _check_pod(self, key: PodKey) -> None:
        pod = self._pods[key]
        binding = self._binding(pod)
        if self._refused.get(key) == (pod.resource_version, binding) or rebind(pod, binding) is None:
            return
        self.due += 1
        self._bindings.poke(key)

    # ------------------------------------------------------------------------------------------ passes

    async def _held_pass(self, name: str) -> float | None:
        return self._repace(name)

    async def _label_pass(self, name: str) -> float | None:
        node = self._nodes.get(name)
        change = label_change(node) if node is not None else None
        if node is None or change is None:
            return None
        written = await self._kube.merge_patch(NODES, name, change.patch())
        self.label_writes += 1
        if _version(written.metadata) > _version(self._nodes.get(name, node).metadata):
            self._nodes[name] = written
        self._log.info("autonomy_label", node=name, label=change.value, reason=change.reason)
        event = object_event(
            api_version="v1",
            kind="Node",
            meta=node.metadata,
            reason=change.reason,
            message=change.message,
            type_="Warning" if change.warning else "Normal",
            component=COMPONENT,
            now=self._clock.stamp(),
        )
        await record_event(self._kube, event, self._log)
        return None

    async def _pod_pass(self, key: PodKey) -> float | None:
        pod = self._pods.get(key)
        if pod is None:
            return None
        binding = self._binding(pod)
        decision = rebind(pod, binding)
        if decision is None or self._refused.get(key) == (pod.resource_version, binding):
            return None
        if isinstance(decision, Refusal):
            await self._refuse(key, pod, binding, decision)
            return None
        try:
            written = await self._kube.merge_patch(PODS, pod.name, decision.patch(pod), namespace=pod.namespace)
        except Conflict:
            return None  # changed meanwhile: the newer copy's event decides again
        except ApiError as exc:
            if exc.status != 422:
                raise
            # The API server's rules on Pod updates (e.g. a version with other validation): said, not retried.
            reason = NOT_BOUND if decision.bound else NOT_RESTORED
            refusal = Refusal(reason, f"the API server refused the change: {clip(exc.message)}")
            await self._refuse(key, pod, binding, refusal)
            return None
        self.pod_writes += 1
        self._store_pod(bound_pod(written))
        log = self._log.bind(pod=f"{pod.namespace}/{pod.name}", node=pod.node)
        if binding is None:
            log.info("tolerations_restored")
        else:
            log.info("tolerations_bound", seconds=binding.seconds if binding.seconds is not None else "forever")
        return None

    async def _refuse(self, key: PodKey, pod: BoundPod, binding: Binding | None, refusal: Refusal) -> None:
        self._refused[key] = (pod.resource_version, binding)
        self._log.warning(
            "pod_binding_refused",
            pod=f"{pod.namespace}/{pod.name}",
            node=pod.node,
            reason=refusal.reason,
            message=refusal.message,
        )
        event = object_event(
            api_version="v1",
            kind="Pod",
            meta=ObjectMeta(name=pod.name, namespace=pod.namespace, uid=pod.uid),
            reason=refusal.reason,
            message=refusal.message,
            type_="Warning",
            component=COMPONENT,
            now=self._clock.stamp(),
        )
        await record_event(self._kube, event, self._log)
