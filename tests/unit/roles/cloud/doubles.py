"""Doubles for testing a whole hub in memory: an API server, a door for memory links, and an edge.

:class:`MemoryApi` keeps objects with resourceVersions, answers watches with a list and then every
change, and can hold status writes (to see what a hub does before one lands). :class:`MemoryDoor`
lets edges in over :func:`~nodetask.link.memory_links` with no socket and no token check, and
:class:`FakeEdge` speaks the protocol's frames over its end.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectSendStream
from prometheus_client import CollectorRegistry

from nodetask import messages
from nodetask.clock import Clock
from nodetask.link import LinkClosed, MemoryLink, memory_links
from nodetask.messages import Downstream, Heartbeat, Hello, Upstream, Welcome
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.metrics import HubMetrics
from roles.cloud.transport.session_handler import ServeEdge
from roles.common.jobtypes import job_types
from roles.kube import ApiError, Conflict, Deleted, Invalid, NotFound, Relisted, Resource, Upserted, WatchEvent
from roles.kube.resources import NODES, job_resource
from schemas.core import Node
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.meta import ObjectMeta
from schemas.v1alpha2 import (
    ImagePrePullJob,
    ImagePrePullJobSpec,
    ImagePrePullJobStatus,
    ImagePrePullNodeTaskStatus,
    ImagePrePullTemplate,
)

T = TypeVar("T", bound=msgspec.Struct)
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
_Key = tuple[str, str, str]


class MemoryApi:
    """An API server in memory, for the calls a hub makes (see :class:`roles.cloud.api.HubApi`)."""

    def __init__(self) -> None:
        self._objects: dict[_Key, Any] = {}
        self._versions = itertools.count(1)
        self._version = 0
        self._watches: list[tuple[Resource[Any], str, MemoryObjectSendStream[WatchEvent]]] = []
        self.watches_opened: collections.Counter[str] = collections.Counter()
        """Watches started, by resource plural."""
        self.lists: list[tuple[str, str, str]] = []
        """Lists made: (plural, namespace, field selector)."""
        self.refuse_lists: set[str] = set()
        """Plurals whose lists fail (403), as without RBAC."""
        self.hold_lists: anyio.Event | None = None
        """While not None, a list (its answer already taken) waits until this event is set before it returns."""
        self.patches: list[tuple[str, str, str]] = []
        """Merge patches made: (plural, name, subresource)."""
        self.reads: collections.Counter[str] = collections.Counter()
        """Objects read one by one (GETs, status writes' reads included), by resource plural."""
        self.status_writes = 0
        """Status writes that changed a job."""
        self.hold_status: anyio.Event | None = None
        """While not None, a status write waits until this event is set before it lands."""
        self.status_errors: list[ApiError] = []
        """Errors the next status writes fail with, one each, before any lands (an API server restarting)."""
        self.events: list[Any] = []
        self.created: list[tuple[str, str]] = []
        """Objects other than Events created: (plural, name)."""

    # ------------------------------------------------------------------------------ for the test

    def put(self, resource: Resource[T], obj: T, *, tell: bool = True) -> T:
        """Create or replace ``obj`` (a new resourceVersion), telling the watches (unless not ``tell``: a
        change they miss, as across a broken watch, until :meth:`relist`).

        Objects of one plural may be stored as different types (a test's richer Pod, the hub's
        ``Pod``): each reader gets them converted to its resource's type.
        """
        meta: ObjectMeta = obj.metadata  # type: ignore[attr-defined]
        self._version = next(self._versions)
        stored = msgspec.structs.replace(
            obj,
            metadata=msgspec.structs.replace(meta, resource_version=str(self._version)),
        )
        self._objects[(resource.plural, meta.namespace, meta.name)] = stored
        if tell:
            self._tell(resource, meta.namespace, stored, deleted=False)
        return stored

    def delete(self, resource: Resource[Any], name: str, namespace: str = "", *, tell: bool = True) -> None:
        """Delete an object, telling the watches (its last state, at a new resourceVersion, as the API does)."""
        gone = self._objects.pop((resource.plural, namespace, name))
        self._version = next(self._versions)
        gone = msgspec.structs.replace(
            gone, metadata=msgspec.structs.replace(gone.metadata, resource_version=str(self._version))
        )
        if tell:
            self._tell(resource, namespace, gone, deleted=True)

    def relist(self, plural: str) -> None:
        """Every watch of ``plural`` lists again (as after a broken watch): a new snapshot."""
        for watched, namespace, send in self._watches:
            if watched.plural == plural:
                _deliver(send, self._snapshot(watched, namespace))

    def _snapshot(self, resource: Resource[Any], namespace: str) -> Relisted[Any]:
        listed = tuple(
            _as(resource, obj, snapshot=True)
            for (plural, ns, _), obj in self._objects.items()
            if plural == resource.plural and namespace in ("", ns)
        )
        return Relisted(listed, resource_version=str(self._version))

    def all(self, resource: Resource[T]) -> list[T]:
        """Every stored object of ``resource``'s plural, as its type."""
        return [_as(resource, obj) for (plural, _, _), obj in self._objects.items() if plural == resource.plural]

    def peek(self, resource: Resource[T], name: str, namespace: str = "") -> T:
        """The stored object, as ``resource``'s type (KeyError when absent)."""
        found: T = _as(resource, self._objects[(resource.plural, namespace, name)])
        return found

    def _tell(self, resource: Resource[Any], namespace: str, obj: Any, *, deleted: bool) -> None:
        for watched, watched_namespace, send in self._watches:
            if watched.plural == resource.plural and watched_namespace in ("", namespace):
                typed = _as(watched, obj)
                _deliver(send, Deleted(typed) if deleted else Upserted(typed))

    # ------------------------------------------------------------------------ what a hub calls

    async def get(self, resource: Resource[T], name: str, *, namespace: str = "") -> T:
        await anyio.lowlevel.checkpoint()
        self.reads[resource.plural] += 1
        try:
            return self.peek(resource, name, namespace)
        except KeyError:
            raise NotFound(404, "NotFound", f"{resource.plural} {name!r} not found") from None

    async def merge_patch(
        self,
        resource: Resource[T],
        name: str,
        patch: dict[str, Any],
        *,
        namespace: str = "",
        subresource: str = "",
        grace: float = 0.0,
    ) -> T:
        await anyio.lowlevel.checkpoint()
        try:
            current = self._objects[(resource.plural, namespace, name)]
        except KeyError:
            raise NotFound(404, "NotFound", f"{resource.plural} {name!r} not found") from None
        self.patches.append((resource.plural, name, subresource))
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != current.metadata.resource_version:
            raise Conflict(409, "Conflict", f"{resource.plural} {name!r} has changed")
        merged = _merge(msgspec.to_builtins(current), patch)
        patched: T = _as(resource, self.put(resource, msgspec.convert(merged, type(current))))
        return patched

    async def list(
        self,
        resource: Resource[T],
        *,
        label_selector: str = "",
        namespace: str = "",
        field_selector: str = "",
        resource_version: str = "",
    ) -> tuple[list[T], list[Invalid], str]:
        await anyio.lowlevel.checkpoint()
        self.lists.append((resource.plural, namespace, field_selector))
        if resource.plural in self.refuse_lists:
            raise ApiError(403, "Forbidden", f"{resource.plural} is forbidden")
        wanted = [term.split("=", 1) for term in field_selector.split(",") if term]
        found = [
            _as(resource, obj)
            for (plural, ns, _), obj in self._objects.items()
            if plural == resource.plural
            and namespace in ("", ns)
            and all(_field(obj, path) == value for path, value in wanted)
        ]
        version = str(self._version)
        if self.hold_lists is not None:
            await self.hold_lists.wait()
        return found, [], version

    async def update_status(
        self,
        resource: Resource[T],
        name: str,
        mutate: Callable[[T], T | None],
        *,
        current: T | None = None,
        namespace: str = "",
    ) -> T | None:
        if self.status_errors:
            await anyio.lowlevel.checkpoint()
            raise self.status_errors.pop(0)
        while True:
            # Always from the stored copy: as fresh as the API server's answer after any conflict.
            current = await self.get(resource, name, namespace=namespace)
            changed = mutate(current)
            if changed is None:
                return current
            if self.hold_status is not None:
                await self.hold_status.wait()
            stored = self._objects.get((resource.plural, namespace, name))
            if stored is None:
                raise NotFound(404, "NotFound", f"{resource.plural} {name!r} not found")
            if stored.metadata.resource_version == current.metadata.resource_version:  # type: ignore[attr-defined]
                self.status_writes += 1
                return self.put(resource, changed)
            # Changed while this write waited: a 409, after which the client reads and applies again.

    async def create(self, resource: Resource[T], obj: T, *, namespace: str = "") -> T:
        """Events are kept in :attr:`events`; other objects are stored (409 if one of the name exists)."""
        await anyio.lowlevel.checkpoint()
        if resource.plural == "events":
            self.events.append(obj)
            return obj
        meta: ObjectMeta = obj.metadata  # type: ignore[attr-defined]
        if (resource.plural, meta.namespace, meta.name) in self._objects:
            raise Conflict(409, "AlreadyExists", f"{resource.plural} {meta.name!r} already exists")
        self.created.append((resource.plural, meta.name))
        return self.put(resource, obj)

    async def watch(
        self,
        resource: Resource[Any],
        send: MemoryObjectSendStream[WatchEvent],
        *,
        label_selector: str = "",
        namespace: str = "",
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        send.send_nowait(self._snapshot(resource, namespace))
        watch = (resource, namespace, send)
        self._watches.append(watch)
        self.watches_opened[resource.plural] += 1
        task_status.started()
        try:
            await anyio.sleep_forever()
        finally:
            self._watches.remove(watch)


def _deliver(send: MemoryObjectSendStream[WatchEvent], event: WatchEvent) -> None:
    """Hand ``event`` to a watch, as ``Kube.watch`` does: one whose consumer is gone (a hub shutting down
    while its last writes land) is told nothing more."""
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        send.send_nowait(event)


def _as(resource: Resource[T], obj: Any, *, snapshot: bool = False) -> Any:
    """``obj`` as ``resource``'s type, or its snapshot type (through its JSON when stored as another)."""
    wanted = resource.snapshot_type if snapshot and resource.snapshot_type is not None else resource.type
    if isinstance(obj, wanted):
        return obj
    return msgspec.json.decode(msgspec.json.encode(obj), type=wanted)


def _field(obj: Any, path: str) -> str:
    """The value at a field selector's dotted ``path`` of ``obj`` (empty when absent)."""
    value: Any = msgspec.to_builtins(obj)
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return str(value)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


class MemoryDoor:
    """Lets edges into a hub over memory links: no socket, no token check."""

    def __init__(self) -> None:
        self._serve: ServeEdge | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    async def __call__(self, serve_edge: ServeEdge, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        async with anyio.create_task_group() as tg:
            self._serve, self._tg = serve_edge, tg
            task_status.started(1)
            await anyio.sleep_forever()

    def connect(self, node: str) -> FakeEdge:
        """A new connection for ``node`` (not yet past its Hello)."""
        assert self._serve is not None, "the hub is not serving yet"
        assert self._tg is not None
        edge_end, hub_end = memory_links()
        self._tg.start_soon(self._serve, node, hub_end)
        return FakeEdge(node, edge_end, hub_end)


class FakeEdge:
    """An edge's end of a session: sends frames, reads what the hub sends."""

    def __init__(self, node: str, link: MemoryLink, hub_end: MemoryLink) -> None:
        self.node = node
        self.link = link
        self.hub_end = hub_end
        """The hub's end, to see how the hub closed it (``closed_with``)."""

    async def hello(self, version: str = "v1", capabilities: tuple[str, ...] = ()) -> Welcome:
        """Say Hello (as an agent with ``capabilities``); the hub's Welcome."""
        await self.send(Hello(node=self.node, version=version, capabilities=capabilities))
        welcome = await self.receive()
        assert isinstance(welcome, Welcome), welcome
        return welcome

    async def send(self, msg: Upstream) -> None:
        await self.link.send(messages.encode(msg))

    async def receive(self) -> Downstream:
        """The next frame from the hub, decoded."""
        return messages.decode_downstream(await self.link.receive())

    async def next_of(self, kind: type[T]) -> T:
        """The next frame of type ``kind``, skipping heartbeat echoes."""
        while True:
            msg = await self.receive()
            if isinstance(msg, Heartbeat):
                continue
            assert isinstance(msg, kind), f"expected {kind.__name__}, got {msg!r}"
            return msg

    async def frames_within(self, seconds: float) -> list[Downstream]:
        """Every frame the hub sends within ``seconds`` (heartbeat echoes included)."""
        frames: list[Downstream] = []
        with anyio.move_on_after(seconds):
            while True:
                frames.append(await self.receive())
        return frames

    async def closed(self) -> None:
        """Read until the hub closes the link."""
        try:
            while True:
                await self.link.receive()
        except LinkClosed:
            return

    async def close(self) -> None:
        await self.link.close()


def prepull_job(
    name: str, uid: str, phases: list[tuple[str, NodeTaskPhase]], *, concurrency: int = 0, timeout: int | None = None
) -> ImagePrePullJob:
    """An ImagePrePullJob in progress whose node entries are ``(node, phase)`` in that order."""
    return ImagePrePullJob(
        metadata=ObjectMeta(name=name, uid=uid),
        spec=ImagePrePullJobSpec(
            image_pre_pull_template=ImagePrePullTemplate(
                images=("registry.example/app:1",), concurrency=concurrency, timeout_seconds=timeout
            )
        ),
        status=ImagePrePullJobStatus(
            phase=JobPhase.IN_PROGRESS,
            node_status=tuple(ImagePrePullNodeTaskStatus(node_name=node, phase=phase) for node, phase in phases),
        ),
    )


def edge_nodes(api: MemoryApi, *names: str) -> None:
    """Register Nodes for ``names`` (the hub marks them when their sessions come up)."""
    for name in names:
        api.put(NODES, Node(metadata=ObjectMeta(name=name)))


@asynccontextmanager
async def running_hub(api: MemoryApi, **settings: Any) -> AsyncIterator[tuple[Hub, MemoryDoor]]:
    """A hub (``hub-a``, no coalescing window) serving a :class:`MemoryDoor` until the block ends."""
    settings.setdefault("coalesce_window", 0.0)
    hub = Hub(
        kube=api,
        clock=Clock.start(),
        log=structlog.get_logger(),
        settings=HubSettings(hub_id="hub-a", **settings),
        job_types=job_types(),
        metrics=HubMetrics(CollectorRegistry(), sessions=lambda: 0, kube=lambda: (0, 0)),
    )
    door = MemoryDoor()
    async with anyio.create_task_group() as tg:
        await tg.start(hub.serve, door)
        yield hub, door
        tg.cancel_scope.cancel()
